# towerpack: Doxygen input filter for the public headers.
#
# The headers use plain C comments (a banner on top, a short contract above
# each declaration, trailing notes after struct members), which read well in
# an editor. This filter turns them into Doxygen comments on the fly, so the
# headers need no markup:
#  - the first comment becomes the file's description (the filter adds one
#    line there, so Doxygen's line numbers past the banner are one off);
#  - a comment on its own line documents what follows it;
#  - a comment after code documents that member;
#  - section dividers (/* ---- name ---- */) stay plain comments.
# Inside comments, characters Doxygen would read as commands or HTML
# (@ \ < > & # %) are escaped.
function escape(text) {
    gsub(/\\/, "\\\\", text)
    gsub(/@/, "\\@", text)
    gsub(/</, "\\<", text)
    gsub(/>/, "\\>", text)
    gsub(/&/, "\\\\\\&", text)
    gsub(/#/, "\\#", text)
    gsub(/%/, "\\%", text)
    return text
}
BEGIN { in_comment = 0; seen_first = 0 }
{
    line = $0
    out = ""
    while (length(line) > 0) {
        if (in_comment) {
            end = index(line, "*/")
            if (end == 0) { out = out escape(line); line = ""; break }
            out = out escape(substr(line, 1, end - 1)) "*/"
            line = substr(line, end + 2)
            in_comment = 0
            continue
        }
        start = index(line, "/*")
        slashes = index(line, "//")
        if (start == 0 || (slashes > 0 && slashes < start)) { out = out line; line = ""; break }
        before = substr(line, 1, start - 1)
        if (!seen_first) {
            name = FILENAME
            sub(/.*\//, "", name)
            opener = "/** @file " name "\n * "
            seen_first = 1
        } else if (substr(line, start) ~ /^\/\* *--/) {
            opener = "/* "   # a section divider: stays a plain comment
        } else if (before ~ /[^ \t]/) {
            opener = "/**< "
        } else {
            opener = "/** "
        }
        out = out before opener
        line = substr(line, start + 2)
        in_comment = 1
    }
    print out
}
