#!/bin/bash
# Runs in a sandbox of its own (separate verifier mode): Harbor copied the agent's
# /app/answer.txt (task.toml's artifacts) back to the same path here.
# Reward 1 when it is exactly right, else 0.
if [ "$(cat /app/answer.txt 2>/dev/null)" = "hello from harbor" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
