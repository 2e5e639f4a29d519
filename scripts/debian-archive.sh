# Sourced by the scripts that fetch from Debian (install-criu.sh, prove-debian.sh).
#
# The URI of the machine's own Debian archive (the entry of its release's suite), never a name
# written here.
debian_uri() {
  local suite files
  suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -n $suite ]] || return 1
  files=(/etc/apt/sources.list.d/*.sources)
  [[ -f ${files[0]} ]] && awk -v suite="$suite" '
    BEGIN { RS = ""; FS = "\n" }
    {
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^#/) continue
        if ($i ~ /^[ \t]/) { val[key] = val[key] " " $i; continue }  # continuation line
        key = tolower(substr($i, 1, index($i, ":") - 1)); val[key] = substr($i, index($i, ":") + 1)
      }
      types = " " val["types"] " "; suites = " " val["suites"] " "; split(val["uris"], u, " ")
      gsub(/[ \t]+/, " ", types); gsub(/[ \t]+/, " ", suites)
      if (tolower(val["enabled"]) !~ /no/ && types ~ / deb / && suites ~ " " suite " " && u[1] != "") {
        print u[1]; exit
      }
      delete val
    }' "${files[@]}" | grep . && return 0
  [[ -f /etc/apt/sources.list ]] || return 1
  awk -v suite="$suite" '$1 == "deb" { sub(/\[[^]]*\][ \t]*/, ""); if ($3 == suite) { print $2; exit } }' \
    /etc/apt/sources.list | grep .
}
