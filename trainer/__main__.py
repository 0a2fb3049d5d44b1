"""`python -m trainer`: see trainer.cli."""

import sys

from trainer.allocator import reexec_with_allocator

reexec_with_allocator(sys.argv[1:])

from trainer.cli import main  # noqa: E402 - after the re-exec, which must precede heavy imports

sys.exit(main())
