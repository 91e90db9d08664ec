"""enginefarm.runner: on the user's device. Detect, resolve, fetch, verify, load; compile on the device if nothing
fits."""
