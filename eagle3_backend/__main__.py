"""``python -m eagle3_backend`` runs the ``eagle3`` command."""

import sys

from eagle3_backend.cli import main

sys.exit(main())
