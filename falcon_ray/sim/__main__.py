"""`python -m falcon_ray.sim serve ...`: the same commands as `falcon-ray sim`."""

from .cli import sim

if __name__ == "__main__":
    sim(prog_name="python -m falcon_ray.sim")
