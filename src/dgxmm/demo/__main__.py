"""python -m dgxmm.demo [--config PATH]: see dgxmm.demo.cold_start."""

from dgxmm.demo.cold_start import main

main()
