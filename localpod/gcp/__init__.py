"""Google Cloud on one machine, as strict as Google: the APIs, IAM, storage."""
