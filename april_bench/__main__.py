import sys

from april_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
