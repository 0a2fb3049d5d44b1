"""What a Cloud Storage call raises when the bucket did not answer (google-cloud-storage's API
errors, and a connection that failed): every room that keeps something in the bucket (the
watch's state, hang forensics, the run's hold) treats these as "not stored, go on"."""

from __future__ import annotations

from google.api_core import exceptions as gexc

STORAGE_ERRORS = (gexc.GoogleAPIError, OSError)
