#!/bin/bash
# start the chains in their own sessions (they survive the call)
mkdir -p /tmp/logs
setsid bash /tmp/repo/.gpu/s/chain.sh all > /tmp/logs/chain_all.out 2>&1 < /dev/null &
setsid bash /tmp/repo/.gpu/s/chain.sh conv > /tmp/logs/chain_conv.out 2>&1 < /dev/null &
sleep 2; cat /tmp/logs/chain_*.pid; cat /tmp/logs/progress 2>/dev/null
