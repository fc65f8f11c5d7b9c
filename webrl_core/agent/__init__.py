"""The agent behind the rollout engine: policies that turn prompts into actions, and the servers that host them.

    policy          in-process policies over a checkpoint (embedded or Hugging Face)
    decode_linear   a policy's matmul form per row count (x W^T, (W x^T)^T, oneDNN packed), measured on the box
    rollout_policy  the policy a rollout uses: in-process, served, or scripted, and its identity
    serving         an OpenAI-compatible server per actor (vLLM or our own), started and stopped with the run
    serve_hf        our own OpenAI-compatible server over transformers
"""
