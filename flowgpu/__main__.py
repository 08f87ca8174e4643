"""``python -m flowgpu``: the same command line as the ``flowgpu`` script."""

from flowgpu.cli import main

if __name__ == "__main__":
    main()
