import sys

from april_bench.cli import main

sys.exit(main())
