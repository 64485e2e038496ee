#!/usr/bin/env python3
# A py-spy stand-in for tests of evidence capture's bounds (issue 48):
# whatever it is asked, a `py-spy dump --json` of 41 threads of 120 frames
# with 3000-byte names, about 15 MB (a real 7-process engine's was 5.6 MB).
# Used by agent/tests/agent/evidence.rs and stack/tests/scenarios/wedges.rs.
import json, sys
name = "deep_" + "x" * 3000
threads = [{"os_thread_id": 900000 + t, "thread_name": "worker-%d" % t, "active": False,
            "owns_gil": False,
            "frames": [{"name": "%s_%d" % (name, f), "short_filename": "engine.py", "line": f}
                       for f in range(120)]}
           for t in range(41)]
sys.stdout.write(json.dumps(threads))
