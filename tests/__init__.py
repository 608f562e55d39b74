"""The tests, one folder per package of src/longboat mirroring it; each folder is a package, so test files in
different folders may share a name (tests/eval/test_config.py, tests/trainer/test_config.py)."""
