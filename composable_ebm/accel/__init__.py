"""What makes the toolkit fast, and nothing else, kept off the reading path of the contract and the algebra:

- `labels`: label checks that read nothing back from the device while a chain runs;
- `derivatives`: a convolution, group normalisation and SiLU that state their own second derivatives (the losses
  that differentiate an input gradient again).

CUDA graphs of a chain's transitions live with the sampler that replays them (`composable_ebm.sampling.graphs`), and
the denoising loss's arithmetic with its trainer (`composable_ebm.training.precision`).
"""
