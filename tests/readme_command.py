"""One command of the README, run as a user runs it, for test_readme_pipeline.py:

    python tests/readme_command.py HUB_DIR SCRIPT.py ARGS...

runs SCRIPT.py with ARGS as `python SCRIPT.py ARGS` would (its __main__, its exit code), except that the Hugging Face
hub is the stand-in of secret_run.py, which keeps in HUB_DIR what --push_to_hub sends: the test has no network."""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    import huggingface_hub
    from secret_run import StandInHub
    StandInHub.hub_dir, script = sys.argv[1], sys.argv[2]
    huggingface_hub.HfApi = StandInHub  # flaxlm imports HfApi from huggingface_hub when it pushes
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT.py` sets it
    runpy.run_path(script, run_name="__main__")
