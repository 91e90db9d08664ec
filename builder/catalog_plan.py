"""The catalog planned offline: every job of every catalog recipe, with the runner it goes to, its memory need, an
estimated build time and the size it stores, from the published parameter counts alone (nothing is downloaded,
nothing imports torch). `enginefarm plan FOLDER --runners ci/runners.toml` prints it.

A job's need follows the build's own rule (builder/memory.py: need_bytes over the component's fp32 weights, plus
the attention at the family's default profile's largest case and a VAE's activations); its stored size is the
weights at the job's precision. A job is routed by the larger of its need and its model's export need (`build`
downloads and exports on the runner that builds). The build-time estimate is fitted to the real-size CPU builds in
docs/large-models.md: 60 s + 70 s per GB of fp32 weights + 550 s per megapixel a VAE validates at; it is a planning
figure, within about 2x of those builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalog import CHECKPOINT, CatalogRecipe, load_catalog_recipe

# Parameters per component, counted on torch's meta device from each model's published config (the shipped config
# sets, builder/catalog_configs.py, and bench/real_sizes.py's transformer configs); they match the publishers' own
# figures (SD 1.5's UNet 859.5 M, SDXL's 2.567 B, Flux.1's transformer 11.9 B, SD3.5 Large's 8.06 B).
_CLIP_L, _CLIP_L_PROJ, _CLIP_G, _OPEN_CLIP_H, _T5_XXL = (
    123_060_480,
    123_650_304,
    694_659_840,
    340_387_840,
    4_762_310_656,
)
_VAE = {"vae_decoder": 49_490_199, "vae_encoder": 34_163_664}
_VAE16 = {"vae_decoder": 49_545_747, "vae_encoder": 34_274_208}
PARAMETERS: dict[str, dict[str, int]] = {
    "sd-1.5": {"text_encoder": _CLIP_L, "unet": 859_520_964, **_VAE},
    "sd-1.5-inpainting": {"text_encoder": _CLIP_L, "unet": 859_535_364, **_VAE},
    "sd-2.1-768-v": {"text_encoder": _OPEN_CLIP_H, "unet": 865_910_724, **_VAE},
    "sd-2-inpainting": {"text_encoder": _OPEN_CLIP_H, "unet": 865_925_124, **_VAE},
    "sdxl-base-1.0": {"text_encoder": _CLIP_L, "text_encoder_2": _CLIP_G, "unet": 2_567_463_684, **_VAE},
    "sdxl-turbo": {"text_encoder": _CLIP_L, "text_encoder_2": _CLIP_G, "unet": 2_567_463_684, **_VAE},
    "sdxl-inpainting-0.1": {"text_encoder": _CLIP_L, "text_encoder_2": _CLIP_G, "unet": 2_567_478_084, **_VAE},
    "sdxl-refiner-1.0": {"text_encoder_2": _CLIP_G, "unet": 2_259_526_660, **_VAE},
    "controlnet-sd1": {"controlnet": 361_279_120},
    "controlnet-sdxl": {"controlnet": 1_251_014_160},
    "sd3.5-medium": {
        "text_encoder": _CLIP_L_PROJ,
        "text_encoder_2": _CLIP_G,
        "text_encoder_3": _T5_XXL,
        "transformer": 2_243_171_520,
        **_VAE16,
    },
    "sd3.5-large": {
        "text_encoder": _CLIP_L_PROJ,
        "text_encoder_2": _CLIP_G,
        "text_encoder_3": _T5_XXL,
        "transformer": 8_056_627_520,
        **_VAE16,
    },
    "flux": {"text_encoder": _CLIP_L, "text_encoder_2": _T5_XXL, "transformer": 11_901_408_320, **_VAE16},
    "flux-schnell": {"text_encoder": _CLIP_L, "text_encoder_2": _T5_XXL, "transformer": 11_891_178_560, **_VAE16},
    "chroma": {"text_encoder": _T5_XXL, "transformer": 8_899_983_424, **_VAE16},
}
# The largest attention of each denoiser (heads, latent pixels per token side; 0: a transformer's 2x2 patches plus
# its text), from the same configs (export/resources.unet_attention for the UNets).
ATTENTION: dict[str, tuple[int, int]] = {
    "sd-1.5": (8, 1),
    "sd-1.5-inpainting": (8, 1),
    "sd-2.1-768-v": (5, 1),
    "sd-2-inpainting": (5, 1),
    "sdxl-base-1.0": (10, 2),
    "sdxl-turbo": (10, 2),
    "sdxl-inpainting-0.1": (10, 2),
    "sdxl-refiner-1.0": (12, 2),
    "sd3.5-medium": (24, 0),
    "sd3.5-large": (38, 0),
    "flux": (24, 0),
    "flux-schnell": (24, 0),
    "chroma": (24, 0),
}
TEXT_TOKENS = {"sd3.5": 589, "flux": 512, "flux-schnell": 512, "chroma": 512}  # the longest text a transformer takes
VAE_CHANNELS = 256  # every SD-class VAE's widest level at full image size
SECONDS_BASE, SECONDS_PER_GB, SECONDS_PER_MEGAPIXEL = 60.0, 70.0, 550.0


@dataclass(frozen=True)
class CatalogJob:
    model: str
    component: str
    target: str
    precision: str
    weight_bytes: int  # fp32
    need_gb: float  # the job's own (builder/memory.py), routed together with export_gb
    stored_bytes: int
    seconds: float
    runner: str | None  # None: no runner can hold it
    why: str = ""  # what it needs, when no runner can
    # What exporting its model needs (export/memory.py: 2x the largest diffusers folder's fp32 weights): `build` of a
    # catalog recipe exports on the runner that builds, so a job goes only where both fit.
    export_gb: float = 0.0


@dataclass(frozen=True)
class CatalogPlan:
    jobs: tuple[CatalogJob, ...]
    models: tuple[CatalogRecipe, ...]
    unknown: tuple[str, ...] = field(default=())  # recipes whose sizes are not known offline (unlocked filters)

    def stored_gb_per_target(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for job in self.jobs:
            out[job.target] = out.get(job.target, 0.0) + job.stored_bytes / 1e9
        return out

    def jobs_per_runner(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for job in self.jobs:
            out[job.runner or "none"] = out.get(job.runner or "none", 0) + 1
        return out

    @property
    def unroutable(self) -> tuple[CatalogJob, ...]:
        return tuple(j for j in self.jobs if j.runner is None)


def parameters_key(recipe: CatalogRecipe) -> str:
    """The row of PARAMETERS a recipe's model takes: its config set, else its model name's family size."""
    if recipe.configs:
        return recipe.configs
    for key in (recipe.name, recipe.family or ""):
        if key in PARAMETERS:
            return key
    return recipe.family or recipe.name


def plan_catalog(paths: list[Path], runners_path: Path | None) -> CatalogPlan:
    """Every job of the catalog recipes at `paths`, routed to `runners_path`'s runners (offline)."""
    from .ci_runners import load_runners

    runners = load_runners(runners_path) if runners_path else None
    recipes = tuple(load_catalog_recipe(p) for p in paths)
    jobs: list[CatalogJob] = []
    unknown = []
    for recipe in recipes:
        components = _components(recipe)
        if not components:
            unknown.append(str(recipe.path))
        export = export_need_gb(recipe, components)
        for component, weights in components.items():
            jobs += _jobs(recipe, component, weights, runners, export)
    return CatalogPlan(tuple(jobs), recipes, tuple(unknown))


def _components(recipe: CatalogRecipe) -> dict[str, int]:
    """Component → fp32 weight bytes. A filter's: its pinned files' size (filters ship fp32 weights)."""
    if recipe.kind == "filter":
        return {"filter": recipe.download_bytes} if not recipe.unlocked else {}
    from enginefarm.families import FAMILIES

    family = FAMILIES[recipe.family or ""]
    counts = dict(PARAMETERS.get(parameters_key(recipe), {}))
    standalone = family.is_controlnet and not any(f.path.startswith("controlnet/") for f in recipe.files)
    if family.is_controlnet and not standalone:  # the base pipeline with its ControlNet: the UNet twice, as exported
        counts.update(controlnet=PARAMETERS[family.id]["controlnet"], unet_controlnet=counts.get("unet", 0))
    if standalone:
        names: tuple[str, ...] = ("controlnet",)  # a ControlNet on its own: the pipeline it plugs into is built apart
    else:
        names = tuple(c.name for c in family.components if c.name not in family.optional or _ships(recipe, c.folder))
    return {name: 4 * counts[name] for name in names if name in counts}


def _ships(recipe: CatalogRecipe, folder: str) -> bool:
    return any(f.path.startswith(f"{folder}/") for f in recipe.files) or any(f.path == CHECKPOINT for f in recipe.files)


def export_need_gb(recipe: CatalogRecipe, components: dict[str, int]) -> float:
    """The export's need by its own rule (export/memory.py), from the largest diffusers folder: a VAE's two halves
    are one folder; a ControlNet model's unet_controlnet is its UNet again. A filter's: its weights' rule alike."""
    from enginefarm.export.memory import FACTOR

    from .memory import BASE, gb

    if not components:
        return 0.0
    folders: dict[str, int] = {}
    for name, weights in components.items():
        if name == "unet_controlnet":
            continue
        folder = "vae" if name.startswith("vae_") else name
        folders[folder] = folders.get(folder, 0) + weights
    largest = max(folders.values())
    return gb(max(int(FACTOR * largest), largest + BASE))


def _jobs(recipe: CatalogRecipe, component: str, weights: int, runners, export_gb: float = 0.0) -> list[CatalogJob]:
    from enginefarm.cache import precision_table

    from .ci_runners import route
    from .memory import gb, need_bytes
    from .recipe import Resources

    precisions = recipe.precisions
    family_precisions = _family_precisions(recipe, component)
    if family_precisions is not None:
        precisions = tuple(p for p in precisions if p in family_precisions) or family_precisions
    activations, megapixels = _activations(recipe, component)
    out = []
    for target in recipe.targets:
        backend = target.split(":")[0]
        for precision in precisions:
            need = gb(need_bytes(weights, backend=backend, precision=precision, activations=activations))
            reduced = precision_table.reduced(precision)
            seconds = SECONDS_BASE + SECONDS_PER_GB * weights / 1e9 + SECONDS_PER_MEGAPIXEL * megapixels
            runner, why = (
                route(target, Resources(max(need, export_gb), 0.0), runners, on_cpu=backend == "tensorrt-rtx" or None)
                if runners
                else (None, "")
            )
            out.append(
                CatalogJob(
                    recipe.name,
                    component,
                    target,
                    precision,
                    weights,
                    need,
                    weights // 2 if reduced else weights,
                    round(seconds),
                    runner.name if runner else None,
                    why,
                    export_gb,
                )
            )
    return out


def _family_precisions(recipe: CatalogRecipe, component: str) -> tuple[str, ...] | None:
    if recipe.kind == "filter":
        return None
    from enginefarm.families import FAMILIES

    family = FAMILIES[recipe.family or ""]
    try:
        return family.component(component).precisions
    except (KeyError, ValueError):
        return None


def _activations(recipe: CatalogRecipe, component: str) -> tuple[int, float]:
    """(bytes a job adds to its weights, batch x megapixels a VAE validates at) at the family's default profile."""
    from .memory import PATCH, attention_bytes, image_activation_bytes

    if recipe.kind == "filter":
        return 0, 0.0
    from enginefarm.families import FAMILIES

    family = FAMILIES[recipe.family or ""]
    latent = (
        recipe.ranges["latent"][2] if "latent" in recipe.ranges else family.pixel_range[1] // family.vae_scale_factor
    )
    pixels, batch = latent * family.vae_scale_factor, recipe.ranges.get("batch", family.batch_range)[2]
    if component.startswith("vae"):
        megapixels = family.vae_batch_range[2] * pixels * pixels / 1e6
        return image_activation_bytes(VAE_CHANNELS, megapixels) + attention_bytes(1, 1, latent * latent), megapixels
    heads, downscale = ATTENTION.get(parameters_key(recipe), (0, 1))
    if component in ("unet", "unet_controlnet", "controlnet") and heads:
        return attention_bytes(heads, batch, (latent // downscale) ** 2), 0.0
    if component == "transformer" and heads:
        text = TEXT_TOKENS.get(recipe.family or "", 512)
        return attention_bytes(heads, batch, (latent // PATCH) ** 2 + text), 0.0
    return 0, 0.0


def catalog_matrix(plan: CatalogPlan, runners_path: Path) -> dict[str, Any]:
    """A GitHub Actions build matrix for the catalog: a model's jobs go together to the runner its largest job needs
    (where that runner builds their target), so the model is downloaded and exported once (`build` of a catalog
    recipe downloads, exports, then builds every job it is asked for); an entry's `targets` select its jobs (`build
    --target`). Jobs no runner holds are listed under `skipped`."""
    from enginefarm.backends import get_backend

    from .ci_matrix import workflow_path
    from .ci_runners import load_runners

    runners = {runner.name: runner for runner in load_runners(runners_path)}
    labels = {name: list(runner.labels) for name, runner in runners.items()}
    paths = {recipe.name: recipe.path for recipe in plan.models}
    biggest: dict[str, CatalogJob] = {}
    for job in plan.jobs:
        if job.runner is not None and (job.model not in biggest or _need(job) > _need(biggest[job.model])):
            biggest[job.model] = job
    groups: dict[tuple[str, str], list[CatalogJob]] = {}
    for job in plan.jobs:
        if job.runner is None:
            continue
        host = runners[biggest[job.model].runner or job.runner]
        runner = host.name if job.target in host.targets else job.runner  # else its own (a GPU target, say)
        groups.setdefault((job.model, runner), []).append(job)
    include = []
    for (model, runner), jobs in groups.items():
        targets = sorted({job.target for job in jobs})
        backends = {get_backend(target.split(":")[0]).extra for target in targets}
        include.append(
            {
                "name": f"{model} on {runner}",
                "runs-on": labels[runner],
                "jobs": "",  # every job of the recipe for these targets: ids exist only once it is exported
                "targets": " ".join(targets),
                "recipes": workflow_path(paths[model]),
                "extras": ",".join(["all", "export"] + sorted(e for e in backends if e)),
                "memory_gb": max(_need(job) for job in jobs),
            }
        )
    skipped = [
        {"label": f"{job.model}/{job.component} {job.target} {job.precision}", "why": job.why}
        for job in plan.unroutable
    ]
    return {
        "jobs": sum(len(jobs) for jobs in groups.values()),
        "entries": len(include),
        "matrix": {"include": include},
        "skipped": skipped,
    }


def _need(job: CatalogJob) -> float:
    return max(job.need_gb, job.export_gb)
