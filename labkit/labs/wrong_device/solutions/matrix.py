# Peer access off: cuda:0 cannot map cuda:1's memory, and Triton refuses the pointer (an exception
# that blames a CPU tensor). Peer access on: the launch runs on cuda:0 over NVLink, unordered with
# cuda:1's stream, and reads the input before it is written. The graph is captured on cuda:0 and
# fails during capture. The guard makes the launch correct.
prediction = {
    "triton launch, peer off": "exception",
    "triton launch, peer on": "wrong result",
    "graph wrong device, peer on": "exception",
    "triton launch, guarded, peer on": "correct",
}
