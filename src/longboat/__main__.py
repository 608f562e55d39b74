"""``python -m longboat`` (what ``torchrun -m longboat`` runs)."""

import sys

from longboat.cli.main import main

sys.exit(main())
