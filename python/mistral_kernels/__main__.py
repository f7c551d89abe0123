"""``python -m mistral_kernels generate ...`` / ``info ...`` (same as the ``mistral-kernels`` script)."""

from .cli import main

raise SystemExit(main())
