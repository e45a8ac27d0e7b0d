"""Model configs are checked as a Triton user expects: `tandem models` names the key, the
file and the problem in one line, and a worker refuses the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import tandem

IO = {
    "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}],
    "outputs": [{"name": "y", "dtype": "float32", "shape": [2]}],
}


def linear() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Linear(4, 2).eval()


def scripted(path: Path) -> None:
    torch.jit.script(linear()).save(str(path))


def state_dict(path: Path) -> None:
    torch.save(linear().state_dict(), str(path))


def fixed_batch_export(path: Path) -> None:
    torch.export.save(torch.export.export(linear(), (torch.zeros(4, 4),)), str(path))


CASES = {
    "unknown-key": (
        {**IO, "max_batch": 8, "artifact": "model.pt"},
        ("model.pt", scripted),
        "config.json: unknown key 'max_batch' in the config (did you mean 'max_batch_size'?)",
    ),
    "unknown-tensor-key": (
        {**IO, "inputs": [{"name": "x", "dtype": "float32", "shap": [4]}], "artifact": "model.pt"},
        ("model.pt", scripted),
        "config.json: unknown key 'shap' in a tensor of inputs (did you mean 'shape'?)",
    ),
    "output-shape": (
        {
            **IO,
            "outputs": [{"name": "y", "dtype": "float32", "shape": [3]}],
            "artifact": "model.pt",
        },
        ("model.pt", scripted),
        "config.json: output y has shape [2] per item (batch of 1: [1, 2]), "
        "the config declares [3]",
    ),
    "output-dtype": (
        {**IO, "outputs": [{"name": "y", "dtype": "int64", "shape": [2]}], "artifact": "model.pt"},
        ("model.pt", scripted),
        "config.json: output y is float32, the config declares int64",
    ),
    "output-count": (
        {
            **IO,
            "outputs": [
                {"name": "y", "dtype": "float32", "shape": [2]},
                {"name": "z", "dtype": "float32", "shape": [2]},
            ],
            "artifact": "model.pt",
        },
        ("model.pt", scripted),
        "config.json: the model returns 1 outputs, the config declares 2",
    ),
    "state-dict": (
        {**IO, "artifact": "model.pt"},
        ("model.pt", state_dict),
        "model.pt: a torch.save file (a state dict or a pickled module), not TorchScript: "
        "save it with torch.jit.save",
    ),
    "fixed-batch-export": (
        {**IO, "artifact": "model.pt2"},
        ("model.pt2", fixed_batch_export),
        "model.pt2: warm-up forward pass of 1 failed: AssertionError: Guard failed: "
        "input.size()[0] == 4; the model was exported for a fixed batch size: export it "
        "with a dynamic batch dimension on every argument, batch = torch.export.Dim('batch', "
        "min=1, max=32); torch.export.export(model, args, dynamic_shapes=tuple({0: batch} for "
        "_ in args)), from an example batch of 2",
    ),
}


@pytest.fixture(params=sorted(CASES))
def bad_model(request, tmp_path) -> tuple[Path, str]:
    config, (filename, write), line = CASES[request.param]
    folder = tmp_path / "repo" / "bad" / "1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    write(folder / filename)
    return tmp_path / "repo", line


def test_the_fixed_batch_hint_exports_a_model_that_loads(tmp_path):
    """The hint's recipe, run as written, on a module whose forward argument is not named
    as the config's input: the export loads and serves batches of 1 to max."""
    args = (torch.zeros(2, 4),)
    batch = torch.export.Dim("batch", min=1, max=32)
    exported = torch.export.export(linear(), args, dynamic_shapes=tuple({0: batch} for _ in args))
    folder = tmp_path / "repo" / "good" / "1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**IO, "artifact": "model.pt2"}))
    torch.export.save(exported, str(folder / "model.pt2"))
    done = tandem("models", str(tmp_path / "repo"), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_models_fails_naming_the_file_and_the_problem_in_one_line(bad_model, tmp_path):
    repo, line = bad_model
    done = tandem("models", str(repo), cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("bad:1: error: ")]
    assert len(lines) == 1, done.stderr
    assert str(repo / "bad" / "1") in lines[0] and line in lines[0], lines[0]
    assert "Traceback" not in done.stderr


def test_a_worker_refuses_the_model_that_models_fails(bad_model, tmp_path, settings):
    repo, line = bad_model
    done = tandem(
        "worker",
        "--repository",
        str(repo),
        "--model",
        "bad:1",
        redis_url=settings.redis_url,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert line in done.stderr.strip().splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr


def test_a_factory_reads_its_own_settings_from_parameters(tmp_path):
    """Free-form settings go under "parameters", as in Triton; not beside the known keys."""
    from tandem.workers.models.spec import load_config

    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    config = {**IO, "artifact": {"factory": "x:y"}, "parameters": {"bert_config": "c.json"}}
    (folder / "config.json").write_text(json.dumps(config))
    assert load_config(folder / "config.json").parameters == {"bert_config": "c.json"}


class TwoLogits(torch.nn.Module):
    """tokens [B, L] int64 and attention_mask [B, L]: 2 logits per item."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) * mask.unsqueeze(-1)
        return self.head(hidden.sum(1) / mask.sum(1, keepdim=True))


def test_the_readme_config_example_loads_as_written(tmp_path):
    """docs/models.md's config.json, with a TorchScript model of that signature, passes every
    check (keys, warm-up outputs) and serves."""
    import re

    from tandem.workers.models.loading import RepoModel
    from tandem.workers.models.spec import load_config

    models = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", models, flags=re.S)
    folder = tmp_path / "clf" / "1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(example)
    torch.jit.script(TwoLogits().eval()).save(str(folder / "model.pt"))
    model = RepoModel(load_config(folder / "config.json"), device="cpu")
    (out,) = model.run([model.validate([1, 2, 3])])
    assert len(out) == 2
