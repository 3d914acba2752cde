"""Fetch each URL through the environment's proxy; one line per URL."""
import os
import sys
import urllib.error
import urllib.request

print("proxy:", "set" if os.environ.get("HTTP_PROXY") else "none", flush=True)
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            print("OK", url, r.status, r.read().decode(errors="replace").splitlines()[0], flush=True)
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace").strip().splitlines()
        print("REFUSED", url, e.code, body[0] if body else "", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is a line of output
        print("ERROR", url, type(e).__name__, e, flush=True)
