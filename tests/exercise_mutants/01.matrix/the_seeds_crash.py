# "It crashes as in the story": the seed's illegal memory access did not come back in the matrix.
prediction = {
    "triton launch, peer off": "illegal memory access",
    "triton launch, peer on": "illegal memory access",
    "graph wrong device, peer on": "illegal memory access",
    "triton launch, guarded, peer on": "correct",
}
