"""The child processes of bench/pipelines.py: each role runs in a fresh Python of its own venv and prints one JSON
line. enginefarm and diffusers run in the project's .venv; OpenVINO GenAI and optimum-intel (which pins an older
transformers) in their own venv, so nothing here imports enginefarm at module level.

    python bench/pipelines_child.py ROLE '{"json": "arguments"}'

Roles: make (seeded random weights over the configs the parent wrote), text (the CLIP text encoder's output in this
venv's torch, and of an OpenVINO IR if named), and one run per runtime (enginefarm, genai, diffusers): load, then
--images images, per-stage seconds, the wall-clock time of the first image and the process's peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPT, NEGATIVE = "a lighthouse on a cliff at dawn, oil painting", "blurry"


def probe() -> tuple[float, float, int, int]:
    """(wall s, this process's CPU s, major page faults, involuntary context switches): a stage whose wall time
    spiked with its CPU time at the usual share was starved of cores; with major faults, it waited on the disk."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_majflt, r.ru_nivcsw


def spans(marks: list[tuple]) -> list[dict]:
    """Between consecutive probes: call start → first step done (text, first step), the steps, last step → the
    image (decode)."""
    keys = ("wall", "cpu", "majflt", "nivcsw")
    return [{k: b[i] - a[i] for i, k in enumerate(keys)} for a, b in zip(marks, marks[1:], strict=False)]


def peak_rss_mb() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def make(a: dict) -> dict:
    """The pipeline folder's weights, seeded, over the configs already in a["folder"] (written by this venv's
    transformers and diffusers: the older ones, which the newer read back)."""
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    sys.path.insert(0, str(ROOT))
    from tests.tiny_pipelines import write_tokenizer  # CLIP's tokenizer format, a hand-written vocabulary (no Hub)

    folder = Path(a["folder"])
    torch.manual_seed(a["seed"])
    pipe = StableDiffusionPipeline(
        vae=AutoencoderKL.from_config(AutoencoderKL.load_config(folder / "vae")).eval(),
        text_encoder=CLIPTextModel(CLIPTextConfig.from_pretrained(folder / "text_encoder")).eval(),
        tokenizer=CLIPTokenizer.from_pretrained(write_tokenizer(folder.parent / f".{folder.name}-tokenizer")),
        unet=UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(folder / "unet")).eval(),
        scheduler=EulerDiscreteScheduler.from_config(EulerDiscreteScheduler.load_config(folder / "scheduler")),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(folder)
    import transformers

    return {"transformers": transformers.__version__}


def text(a: dict) -> dict:
    """The text encoder's last hidden state for fixed token ids, by this venv's transformers from the folder, and by
    the OpenVINO IR a["ir"] if given: saved as .npy files for the parent to compare."""
    import torch
    import transformers
    from transformers import CLIPTextModel

    ids = np.array(a["ids"], np.int64)[None]
    model = CLIPTextModel.from_pretrained(Path(a["folder"]) / "text_encoder").eval()
    with torch.no_grad():
        hidden = model(torch.from_numpy(ids)).last_hidden_state.numpy()
    out = {"torch": a["out"] + ".torch.npy", "transformers": transformers.__version__}
    np.save(out["torch"], hidden)
    if a.get("ir"):
        import openvino as ov

        compiled = ov.Core().compile_model(a["ir"], "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        got = compiled({compiled.inputs[0].any_name: ids.astype(np.int64)})
        out["ir_file"] = a["out"] + ".ir.npy"
        np.save(out["ir_file"], np.asarray(got[compiled.outputs[0]]))
    return out


def _result(load_s: float, first_image_at: float, images: list[dict], image: np.ndarray, a: dict) -> dict:
    np.save(a["image_out"], np.asarray(image, np.float32))
    return {"load_s": load_s, "first_image_at": first_image_at, "images": images, "peak_rss_mb": peak_rss_mb()}


def run_enginefarm(a: dict) -> dict:
    start = time.perf_counter()  # the load counts its imports, as GenAI's and diffusers' do
    from enginefarm.diffusion import Pipeline

    pipe = Pipeline.load(
        a["name"], store=a["store"], assets=a["assets"], target="openvino:cpu", precision="fp32", device="cpu"
    )
    load_s = time.perf_counter() - start
    latents = np.load(a["latents"])
    images, first_image_at, image = [], 0.0, None
    for _ in range(a["images"]):
        marks: list[float] = []
        probes = [probe()]
        image = pipe(
            PROMPT,
            NEGATIVE,
            steps=a["steps"],
            width=a["size"],
            height=a["size"],
            latents=latents,
            on_step=lambda done, total, marks=marks, probes=probes: (
                marks.append(time.perf_counter()),
                probes.append(probe()),
            ),
        )
        probes.append(probe())
        first_image_at = first_image_at or time.time()
        t = pipe.timings
        later = list(np.diff(marks))  # the first step: the denoise stage less the steps after it
        images.append(
            {
                "text": t["text"],
                "steps": [t["denoise"] - sum(later), *later],
                "decode": t["decode"],
                "spans": spans(probes),
            }
        )
    return _result(load_s, first_image_at, images, image, a)


def run_genai(a: dict) -> dict:
    start = time.perf_counter()
    import openvino_genai as genai

    # fp32 like enginefarm's artifacts: left to its default, OpenVINO computes in bf16 on a CPU with avx512_bf16/AMX
    fp32 = {"INFERENCE_PRECISION_HINT": "f32"}
    if a.get("static"):  # GenAI's best shape: the request's, compiled static
        pipe = genai.Text2ImagePipeline(a["folder"])
        pipe.reshape(1, a["size"], a["size"], 7.5)
        pipe.compile("CPU", **fp32)
    else:
        pipe = genai.Text2ImagePipeline(a["folder"], "CPU", **fp32)
    load_s = time.perf_counter() - start
    images, first_image_at, image = [], 0.0, None
    for i in range(a["images"]):
        probes = [probe()]
        tensor = pipe.generate(
            PROMPT,
            negative_prompt=NEGATIVE,
            width=a["size"],
            height=a["size"],
            num_inference_steps=a["steps"],
            guidance_scale=7.5,
            rng_seed=i,
            callback=lambda step, total, latent, probes=probes: probes.append(probe()) and False,  # False: go on
        )
        probes.append(probe())
        first_image_at = first_image_at or time.time()
        image = np.asarray(tensor.data)[0].astype(np.float32) / 255.0
        m = pipe.get_performance_metrics()
        images.append(
            {
                "text": sum(m.get_text_encoder_infer_duration().values()) / 1e3,  # ms per encoder
                "steps": [d / 1e6 for d in m.raw_metrics.iteration_durations],  # µs
                "decode": m.get_vae_decoder_infer_duration() / 1000,
                "spans": spans(probes),
            }
        )
    return _result(load_s, first_image_at, images, image, a)


def run_diffusers(a: dict) -> dict:
    start = time.perf_counter()
    import torch
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(a["folder"], torch_dtype=torch.float32)
    load_s = time.perf_counter() - start
    marks: dict[str, list[float]] = {}

    def timed(stage, fn):
        def call(*args, **kwargs):
            started = time.perf_counter()
            result = fn(*args, **kwargs)
            marks.setdefault(stage, []).append(time.perf_counter() - started)
            marks["after " + stage] = [time.perf_counter()]
            return result

        return call

    pipe.encode_prompt = timed("text", pipe.encode_prompt)
    pipe.vae.decode = timed("decode", pipe.vae.decode)
    latents = torch.from_numpy(np.load(a["latents"]))
    images, first_image_at, image = [], 0.0, None
    for _ in range(a["images"]):
        marks.clear()
        steps: list[float] = []

        probes = [probe()]

        def on_step(pipe_, i, t, kwargs, steps=steps, probes=probes):
            steps.append(time.perf_counter())
            probes.append(probe())
            return kwargs

        with torch.inference_mode():
            image = pipe(
                PROMPT,
                negative_prompt=NEGATIVE,
                num_inference_steps=a["steps"],
                width=a["size"],
                height=a["size"],
                latents=latents,
                output_type="np",
                callback_on_step_end=on_step,
            ).images[0]
        probes.append(probe())
        first_image_at = first_image_at or time.time()
        bounds = [marks["after text"][0], *steps]
        images.append(
            {
                "text": sum(marks["text"]),
                "steps": list(np.diff(bounds)),
                "decode": sum(marks["decode"]),
                "spans": spans(probes),
            }
        )
    return _result(load_s, first_image_at, images, image, a)


ROLES = {
    "make": make,
    "text": text,
    "enginefarm": run_enginefarm,
    "genai": run_genai,
    "genai-static": lambda a: run_genai({**a, "static": True}),
    "diffusers": run_diffusers,
}

if __name__ == "__main__":
    role, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(ROLES[role](arguments), default=float))
