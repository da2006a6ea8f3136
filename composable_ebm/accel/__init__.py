"""What makes the toolkit fast, and nothing else, kept off the reading path of the contract and the algebra:

- `labels`: label checks that read nothing back from the device while a chain runs;
- `derivatives`: a convolution, group normalisation and SiLU that state their own second derivatives (the losses
  that differentiate an input gradient again);
- `graphs`: a chain's runs of identical transitions, and a denoising iteration, replayed from CUDA graphs;
- `precision`: bfloat16 autocast where the device has bfloat16 arithmetic of its own, float32 otherwise.
"""
