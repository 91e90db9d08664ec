"""Custom weights as users download them, read into what each component's build understands.

A file from a model site (a single-file checkpoint in the original or SGM layout, a VAE, a LoRA for the UNet and
the text encoders at once, a textual-inversion embedding) is read once; each component takes its own part, in
diffusers' names, and `enginefarm.runner.custom` applies it to the component's base artifact. The key layouts are
data, in one place each. numpy only: the runtime reads these files without torch."""
