"""Small scenarios that must fail with a clear exception; prints the message."""

import sys

import pyddstore


def method0_file():
    try:
        pyddstore.PyDDStore(pyddstore.FileComm(), method=0)
    except pyddstore.DDStoreUnsupportedError as e:
        print(e)
        return
    raise SystemExit("no error")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
