"""Runs of the whole pipeline that answer a question: the paper's ablation and the re-run of a recorded phase.

    ablation   WebRL vs without replay vs without KL and replay (paper Fig. 5), over phases and seeds
    reproduce  re-run a recorded phase from its artifacts and compare the outputs
"""
