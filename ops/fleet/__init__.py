"""The workers: SSH fan-out, probes, OS Login, job status, forensics."""
