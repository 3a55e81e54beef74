"""python/tests: the host-backend suite here; gpu/ needs torch and GPUs (ci/gpu/python.sh)
and is left out where torch is not installed."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("torch") else ["gpu"]
