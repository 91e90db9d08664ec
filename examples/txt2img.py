"""Text to image from an app, on the runtime library alone: `enginefarm.diffusion.Pipeline` fetches, verifies and
loads each component of a model the farm built (and its tokenizers and scheduler config, published beside it), then
runs the family's own loop (SD 1.x/2.x, SDXL and its refiner, ControlNet; see docs/pipelines.md, "Families").

    python examples/txt2img.py MODEL "a lighthouse at dawn" [--steps 25] [--seed 7] [--size 512] [--guidance 7.5]
                               [--scheduler euler_a] [--precision fp16] [--target openvino:cpu] [--budget 6G]
                               [--tiles] [--out image.png]

Make MODEL with `enginefarm export DIFFUSERS_FOLDER --out exported/` then `enginefarm build exported/recipe.toml`
(ENGINEFARM_STORE or --store names the store). It prints each stage's time and writes a PNG. `enginefarm generate`
is the same from the command line.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("prompt")
    p.add_argument("--negative", default=None)
    p.add_argument("--steps", type=int, default=None, help="default: the family's (25; Flux schnell 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default the model's native size)")
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--scheduler", default=None)
    p.add_argument("--precision", default=None)
    p.add_argument("--target", default=None)
    p.add_argument("--store", default=None)
    p.add_argument("--budget", default=None, help='memory budget: bytes, a size such as 6G, or "auto"')
    p.add_argument("--tiles", action="store_true", help="decode in tiles (large images in little memory)")
    p.add_argument("--out", default="image.png")
    args = p.parse_args(argv)

    from enginefarm.diffusion import Pipeline, write_png
    from enginefarm.errors import EnginefarmError

    started = time.perf_counter()
    try:
        with Pipeline.load(
            args.model, store=args.store, precision=args.precision, target=args.target, memory_budget=args.budget
        ) as pipe:
            if args.tiles:
                pipe.enable_vae_tiling()
            image = pipe(
                args.prompt,
                args.negative,
                steps=args.steps,
                seed=args.seed,
                width=args.size,
                height=args.size,
                guidance_scale=args.guidance,
                scheduler=args.scheduler,
                on_step=lambda done, total: print(f"step {done}/{total}", flush=True),
            )
            timings = dict(pipe.timings)
    except EnginefarmError as exc:
        print(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1
    write_png(args.out, image)
    for stage, seconds in timings.items():
        if stage != "steps":
            print(f"{stage}: {seconds:.2f} s")
    print(f"wrote {args.out} ({image.shape[1]}x{image.shape[0]}) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
