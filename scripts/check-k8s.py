#!/usr/bin/env python3
"""Validates Kubernetes manifests against the Kubernetes schemas
(`kubernetes-validate`, strict: unknown fields are errors) and prints every
document as one JSON line, for the test that checks what they say
(stack/tests/scenarios/deploy.rs). Run with .venv-checks/bin/python
(scripts/setup-checks.sh). Exit 1 naming the file, the resource and the
problem when one does not validate."""
import json
import sys

import kubernetes_validate
import yaml

VERSION = "1.32.0"  # the oldest Kubernetes still supported upstream


def main(paths):
    bad = 0
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        for doc in docs:
            what = f"{path}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            try:
                kubernetes_validate.validate(doc, VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                print(f"{what}: {e.message} (at {'.'.join(str(p) for p in e.path)})", file=sys.stderr)
                bad += 1
                continue
            except Exception as e:  # an unknown kind or version
                print(f"{what}: {e}", file=sys.stderr)
                bad += 1
                continue
            print(json.dumps({"file": path, "doc": doc}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
