"""``python -m llmconn`` is the ``llmconn`` command."""

import sys

from llmconn.cli import main

sys.exit(main())
