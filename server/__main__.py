"""`python -m server measure ...`: see server/measure_cli.py."""
import sys

from server.measure_cli import main

sys.exit(main())
