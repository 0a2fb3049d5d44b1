"""Google's APIs as recovery uses them: the provider seam and the TPU API's provider."""
