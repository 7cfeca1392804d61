# Two network namespaces joined by a veth pair, for the multi-node tests (dist_netns.sh,
# launch_netns.sh), sourced after the caller defines skip() (prints why, exits 77).
#   netns_pair TAG SUBNET     e.g. netns_pair tg$$ 10.77.0
# makes namespaces ${TAG}a (SUBNET.1/24) and ${TAG}b (SUBNET.2/24) with loopback up, sets $nsa,
# $nsb and a temporary directory $work, and removes all three when the shell exits. Addresses are
# private and exist only inside the two namespaces.
netns_pair() {
  local tag="$1" subnet="$2"
  nsa="${tag}a"; nsb="${tag}b"
  work="$(mktemp -d)"
  trap 'ip netns del "$nsa" 2>/dev/null || true; ip netns del "$nsb" 2>/dev/null || true; rm -rf "$work"' EXIT
  ip netns add "$nsa" 2>/dev/null || skip "cannot create a network namespace here ($(ip netns add "$nsa" 2>&1 || true))"
  ip netns add "$nsb"
  ip link add "v${tag}a" type veth peer name "v${tag}b" || skip "cannot create a veth pair"
  ip link set "v${tag}a" netns "$nsa"
  ip link set "v${tag}b" netns "$nsb"
  ip -n "$nsa" addr add "$subnet.1/24" dev "v${tag}a"
  ip -n "$nsb" addr add "$subnet.2/24" dev "v${tag}b"
  local ns
  for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
  ip -n "$nsa" link set "v${tag}a" up
  ip -n "$nsb" link set "v${tag}b" up
}
