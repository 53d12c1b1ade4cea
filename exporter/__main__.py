import sys

from exporter.cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports it in a worker (as __mp_main__)
    sys.exit(main())
