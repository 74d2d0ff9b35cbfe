# hack/lib/gobuild.sh — helpers shared by hack/testbin and hack/labbin, which build real
# programs from Go modules into a per-version cache outside the repository. Sourced, not run.
#
# The caller sets before sourcing:
#   LOG_TAG  prefix of every log line (e.g. testbin)
#   WORK     folder of the wrapper modules (one sub-folder per wrapper)
#   BIN      folder the programs are installed into
#   JOBS     go build -p
#   TPL      folder of the wrapper templates (<name>.go.mod.in)
#   SUBST    sed expressions applied to every template (the @VERSION@ placeholders)
# and gets log/die/step_begin/step_end/skip, modinfo, render, resolve, gobuild, install_bin, need,
# k8s_staging_replaces and k8s_version_ldflags.

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }

STEP=""
STEP_T=0
SUMMARY=()
step_begin() { STEP="$1"; STEP_T=$(date +%s); log "==> $STEP"; }
step_end() {
  local dt=$(( $(date +%s) - STEP_T ))
  log "<== $STEP: ${dt}s"
  SUMMARY+=("$(printf '%-48s %6ss' "$STEP" "$dt")")
  STEP=""
}
skip() { log "--- $1: already built"; SUMMARY+=("$(printf '%-48s %7s' "$1" cached)"); }
# On failure, name the step that failed and how long it ran.
trap 'rc=$?; if [[ $rc -ne 0 && -n "$STEP" ]]; then printf "[%s] FAILED: %s (after %ss, exit %s); see the output above\n" "$LOG_TAG" "$STEP" "$(( $(date +%s) - STEP_T ))" "$rc" >&2; fi' EXIT

# modinfo MODULE@VERSION FIELD -> value of "GoMod" / "Dir" from `go mod download -json`.
modinfo() {
  local json
  mkdir -p "$WORK"
  json="$(cd "$WORK" && GOFLAGS= go mod download -json "$1")" || true
  if grep -q '"Error"' <<<"$json" || ! grep -q "\"$2\"" <<<"$json"; then
    die "cannot download Go module $1 from GOPROXY=$(go env GOPROXY):
$json"
  fi
  sed -n "s|^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}$|\1|p" <<<"$json"
}

# render NAME UPSTREAM_MOD [DIR]: fresh wrapper dir $WORK/DIR (default NAME) with go.mod from
# $TPL/NAME.go.mod.in (placeholders substituted by $SUBST), plus the go/godebug lines of the
# upstream .mod file. The files of $TPL/NAME/ (a main package of ours) are copied beside it.
render() {
  local name="$1" upstream_mod="$2" d="$WORK/${3:-$1}" directives
  [[ -f "$TPL/$name.go.mod.in" ]] || die "missing template $TPL/$name.go.mod.in"
  mkdir -p "$d"
  sed "${SUBST[@]}" "$TPL/$name.go.mod.in" >"$d/go.mod"
  if [[ -d "$TPL/$name" ]]; then cp -r "$TPL/$name/." "$d/"; fi
  [[ -n "$upstream_mod" ]] || return 0
  directives="$(grep -E '^(go|godebug) ' "$upstream_mod" || true)"
  grep -q '^go ' <<<"$directives" || die "$name: no 'go' line in $upstream_mod"
  printf '\n%s\n' "$directives" >>"$d/go.mod"
  # keep go.sum from an earlier (interrupted) run: extra lines are harmless
}

# gobuild NAME OUT PKG LDFLAGS: build one program in wrapper $WORK/NAME into $BIN/.OUT.tmp.
gobuild() {
  local name="$1" out="$2" pkg="$3" ldf="$4"
  (cd "$WORK/$name" && CGO_ENABLED=0 go build -mod=mod -p "$JOBS" -trimpath -ldflags "-s -w $ldf" -o "$BIN/.$out.tmp" "$pkg") \
    || die "go build of $out ($pkg) failed"
}

# resolve NAME PKG...: download/resolve all modules the packages need (timed separately).
resolve() {
  local name="$1"; shift
  (cd "$WORK/$name" && go list -mod=mod -deps "$@" >/dev/null) \
    || die "$name: resolving the module graph for $* failed (a module version may not be served by the proxy)"
}

# install_bin OUT EXPECT CMD...: run CMD (a --version style check) on the fresh binary,
# require EXPECT in its output, then move it into place.
install_bin() {
  local out="$1" expect="$2"; shift 2
  local got
  got="$("$BIN/.$out.tmp" "$@" 2>&1)" || true
  if ! grep -qF -- "$expect" <<<"$got"; then
    rm -f "$BIN/.$out.tmp"
    die "$out: '$out $*' did not print '$expect'; got:
$got"
  fi
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  log "    $out: ok: $(grep -F -- "$expect" <<<"$got" | head -n1 | tr -s ' ' | sed 's/^ //') ($(du -h "$BIN/$out" | cut -f1))"
}

# need B...: true when one of the programs is missing from $BIN.
need() { local b; for b in "$@"; do [[ -x "$BIN/$b" ]] || return 0; done; return 1; }

# k8s_staging_replaces NAME K8S_MOD STAGING_VERSION: one `replace k8s.io/X => k8s.io/X vSTAGING`
# per staging module, READ from upstream's own go.mod (never a hand-kept list).
k8s_staging_replaces() {
  local name="$1" k8s_mod="$2" staging="$3" m edits=() mods
  mapfile -t mods < <(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/.*|\1|p' "$k8s_mod")
  (( ${#mods[@]} >= 20 )) || die "kubernetes: found only ${#mods[@]} staging replaces in $k8s_mod"
  for m in "${mods[@]}"; do edits+=("-replace=$m=$m@v$staging"); done
  (cd "$WORK/$name" && go mod edit "${edits[@]}")
  log "    ${#mods[@]} staging modules replaced at v$staging"
}

# k8s_version_ldflags VERSION: version stamping as upstream's hack/lib/version.sh does it;
# without it /version says v0.0.0-master (Cluster API refuses such a cluster, kubeadm too).
k8s_version_ldflags() {
  local v="$1" major minor p out=""
  major="${v%%.*}"; minor="${v#*.}"; minor="${minor%%.*}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $p.gitVersion=v$v -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    out+=" -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000"
    out+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$out"
}
