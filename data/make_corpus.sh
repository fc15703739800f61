#!/bin/sh
# Rebuilds data/kjv.txt from Debian's bible-kjv packages (the text is in the public domain;
# see data/README.md). Needs only apt-get download and dpkg-deb; nothing is installed.
#   sh data/make_corpus.sh            # writes data/kjv.txt next to this script
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
cd "$work"
apt-get download bible-kjv bible-kjv-text >/dev/null
for deb in *.deb; do dpkg-deb -x "$deb" x; done
./x/usr/bin/bible -f -p "$work/x/usr/lib" "gen1:1-rev22:21" </dev/null >full.txt
# Keep a few books (about 1.3 MB): one verse per line, a blank line and a heading per chapter.
awk -v keep="Ge=Genesis;Exo=Exodus;Ruth=Ruth;Job=Job;Psa=Psalms;Prv=Proverbs;Eccl=Ecclesiastes;SSol=The Song of Solomon;Mat=Matthew;Mark=Mark;Luke=Luke;John=John" '
BEGIN {
  n = split(keep, pairs, ";");
  for (i = 1; i <= n; i++) { split(pairs[i], kv, "="); name[kv[1]] = kv[2]; }
}
{
  ref = $1;
  if (!match(ref, /[0-9]+:[0-9]+$/)) next;
  book = substr(ref, 1, RSTART - 1);
  split(substr(ref, RSTART), cv, ":");
  if (!(book in name)) next;
  text = substr($0, length(ref) + 2);
  if (book != last_book || cv[1] != last_chapter) {
    if (NR > 1 && started) printf "\n";
    printf "%s %s\n\n", name[book], cv[1];
    last_book = book; last_chapter = cv[1]; started = 1;
  }
  print text;
}' full.txt >"$here/kjv.txt"
echo "wrote $here/kjv.txt ($(wc -c <"$here/kjv.txt") bytes)"
