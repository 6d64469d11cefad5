"""A run with secrets, as a user starts it, for test_secrets.py:

    python tests/secret_run.py RECIPE HUB_DIR ARGS...

runs run_clm_flax.py with `--config_file RECIPE ARGS` (ARGS hold --hub_token) twice in this one process. The first run
crashes at step 3 with an error that quotes the tokens of the command line, the recipe and the environment (HF_TOKEN),
as a library's error may quote the token it was handed; the second resumes it from its checkpoint, finishes and
exports with --push_to_hub to a stand-in for the hub (huggingface_hub.HfApi as flaxlm.training.output_dir uses it)
that keeps in HUB_DIR what it is sent, and the sha256 of the token it was given to authenticate."""
import hashlib
import json
import os
import shutil
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StandInHub:
    hub_dir = None

    def __init__(self, token=None):
        self.token_sha256 = hashlib.sha256(str(token).encode()).hexdigest()

    def _record(self, call, **sent):
        with open(os.path.join(self.hub_dir, "calls.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"call": call, "token_sha256": self.token_sha256, **sent}, default=str) + "\n")

    def whoami(self):
        self._record("whoami")
        return {"name": "user"}

    def create_repo(self, repo_id, **options):
        self._record("create_repo", repo_id=repo_id, **options)

    def upload_folder(self, folder_path, repo_id, ignore_patterns=None, **options):
        from huggingface_hub.utils import filter_repo_objects
        files = [os.path.relpath(os.path.join(d, name), folder_path) for d, _, names in os.walk(folder_path)
                 for name in names]
        sent = sorted(filter_repo_objects(files, ignore_patterns=ignore_patterns))
        for path in sent:
            os.makedirs(os.path.dirname(os.path.join(self.hub_dir, repo_id, path)), exist_ok=True)
            shutil.copy(os.path.join(folder_path, path), os.path.join(self.hub_dir, repo_id, path))
        self._record("upload_folder", repo_id=repo_id, files=sent, **options)


def main():
    import huggingface_hub
    import run_clm_flax
    from flaxlm.data.rows import ShuffledRows
    from flaxlm.errors import run_main
    recipe, StandInHub.hub_dir, *args = sys.argv[1:]
    argv = ["--config_file", recipe, *args]
    with open(recipe, encoding="utf-8") as f:
        quoted = [args[args.index("--hub_token") + 1], yaml.safe_load(f)["token"], os.environ["HF_TOKEN"]]
    original = ShuffledRows.batch_rows

    def crash(self, step, local):
        if step == 3:
            raise PermissionError(f"401 Client Error: Unauthorized for tokens {', '.join(quoted)}")
        return original(self, step, local)
    ShuffledRows.batch_rows = crash
    try:
        run_main(lambda: run_clm_flax.main(argv))
    except SystemExit as e:
        assert e.code == 1, e.code
    ShuffledRows.batch_rows = original
    huggingface_hub.HfApi = StandInHub
    run_main(lambda: run_clm_flax.main([*argv, "--resume_from_checkpoint", "latest", "--push_to_hub",
                                        "--hub_model_id", "user/secret-run"]))
    print("secret_run: crashed, resumed and pushed")


if __name__ == "__main__":
    main()
