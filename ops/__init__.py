"""ops: recovery and operations of a slice (tpupod watch, status, ssh, checkpoints).

google-api-core warns on import, on every command, that it will drop this Python in 2027: one
filter here, before any ops module imports a Google client.
"""

import warnings

warnings.filterwarnings("ignore", message="You are using a Python version", category=FutureWarning)
