#!/usr/bin/env bash
# Fill DEST (default .cache/kafka/libs) with the jars of the local Kafka broker, from Maven Central.
# Idempotent: Maven re-uses ~/.m2; the jars land in a staging directory first and are synced into DEST
# only when the whole set resolved, so a failed run never leaves a half-filled classpath behind.
# On failure the exact Maven error is printed and the script exits 1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-.cache/kafka/libs}"
plugin="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

command -v mvn >/dev/null || { echo "fetch-jars: mvn (Maven) is not installed" >&2; exit 1; }
command -v java >/dev/null || { echo "fetch-jars: java (JDK 17+) is not installed" >&2; exit 1; }

mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
stage="$(mktemp -d "${dest%/}.stage.XXXXXX")"
log="$stage.log"
trap 'rm -rf "$stage"' EXIT

version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
echo "fetch-jars: resolving kafka_2.13 $version and its dependencies from Maven Central" \
  "(a cold ~/.m2 downloads ~45 MB)..."
start=$(date +%s)
# Maven's output goes to a log; the jars it downloads are echoed as they arrive (the progress shown on a
# cold ~/.m2; a warm one prints nothing and finishes in a few seconds). PIPESTATUS keeps Maven's exit code.
set +e
mvn -B -Dstyle.color=never -f "$here/pom.xml" "$plugin:copy-dependencies" \
    -DincludeScope=runtime -DoutputDirectory="$stage" 2>&1 \
  | tee "$log" \
  | sed -un 's:^\(\[INFO\] \)\{0,1\}Downloaded from [^:]*\: .*/\([^/]*\.jar\) (\(.*\)):  downloaded \2 (\3):p'
mvn_rc=${PIPESTATUS[0]}
set -e
if [ "$mvn_rc" -ne 0 ]; then
  echo "fetch-jars: Maven failed (exit $mvn_rc) to fetch the Kafka jars. Maven said:" >&2
  grep -E '^\[(ERROR|FATAL)\]' "$log" >&2 || tail -n 40 "$log" >&2
  echo "fetch-jars: full log: $log" >&2
  exit 1
fi

# Sanity: the broker, its storage tool and the SLF4J binding must be there.
for jar in kafka_2.13 kafka-server kafka-clients log4j-slf4j-impl log4j-core scala-library; do
  if ! compgen -G "$stage/$jar-[0-9]*.jar" >/dev/null; then
    echo "fetch-jars: $jar is missing from the resolved set (see $log)" >&2
    exit 1
  fi
done

# Sync the complete set into DEST: drop jars the pom no longer names, replace only jars that differ, so a
# broker running from DEST keeps its (unchanged) files when this runs again.
shopt -s nullglob
for jar in "$dest"/*.jar; do
  if [ ! -e "$stage/$(basename "$jar")" ]; then rm -f "$jar"; fi
done
for jar in "$stage"/*.jar; do
  if ! cmp -s "$jar" "$dest/$(basename "$jar")"; then mv -f "$jar" "$dest/"; fi
done
rm -f "$log"
count=$(find "$dest" -maxdepth 1 -name '*.jar' | wc -l)
size=$(du -sh "$dest" | cut -f1)
echo "fetch-jars: $count jars ($size) in $dest after $(( $(date +%s) - start ))s"
