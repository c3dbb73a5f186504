"""Importing gact_fx stays cheap: no CUDA initialisation, no Triton, no Dynamo."""

import subprocess
import sys


def test_importing_gact_fx_starts_neither_cuda_nor_triton_nor_dynamo():
    code = (
        "import sys, torch, gact_fx\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "assert 'torch._dynamo' not in sys.modules, 'dynamo imported'\n"
        "assert 'torch._inductor' not in sys.modules, 'inductor imported'\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
