// Package docs checks that the README and docs/ refer only to what the repository has:
// every relative link and its anchor, every repository path, every test named and
// every make target resolve here, and no link leaves the repository.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// root is the repository, seen from this package's directory.
const root = "../.."

// pages are the Markdown files checked, relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lineOf is the 1-based line of offset i in s.
func lineOf(s string, i int) int { return strings.Count(s[:i], "\n") + 1 }

var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading  = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	notSlug  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	fence    = regexp.MustCompile("(?ms)^```.*?^```")
	codeSpan = regexp.MustCompile("`[^`\n]+`")
)

// anchors are the GitHub anchors of a page's headings.
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(page, ""), -1) {
		slug := strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		// GitHub numbers repeated headings: slug, slug-1, slug-2, ...
		s := slug
		for n := 1; out[s]; n++ {
			s = slug + "-" + strconv.Itoa(n)
		}
		out[s] = true
	}
	return out
}

// Every relative link names a file of the repository, and its anchor a heading there.
func TestRelativeLinksResolve(t *testing.T) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages(t) {
		text := read(t, p)
		for _, m := range mdLink.FindAllStringSubmatchIndex(text, -1) {
			target := text[m[2]:m[3]]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := filepath.Join(filepath.Dir(filepath.Join(absRoot, p)), file)
			if file == "" {
				dest = filepath.Join(absRoot, p)
			}
			if rel, err := filepath.Rel(absRoot, dest); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s:%d: %s leaves the repository", p, lineOf(text, m[0]), target)
				continue
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s:%d: %s: %v", p, lineOf(text, m[0]), target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") {
				b, err := os.ReadFile(dest)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(string(b))[anchor] {
					t.Errorf("%s:%d: %s: no such heading", p, lineOf(text, m[0]), target)
				}
			}
		}
	}
}

// Every path written as the repository's (docs/failover.md, internal/instance/agent/lockout.go,
// test/pg) exists, and so does every path relative to a page (../README.md).
func TestRepositoryPathsExist(t *testing.T) {
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	// The repository's own top-level directories: not .git, nor those .gitignore keeps
	// out of it (bin/, which a build fills, is not part of a fresh clone).
	ignored := map[string]bool{".git": true}
	for _, line := range strings.Split(read(t, ".gitignore"), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSuffix(strings.TrimSpace(line), "/"), "/"); ok {
			ignored[name] = true
		}
	}
	var tops []string
	for _, e := range entries {
		if e.IsDir() && !ignored[e.Name()] {
			tops = append(tops, regexp.QuoteMeta(e.Name()))
		}
	}
	// A top-level directory, a slash and more, not preceded by what would make it part
	// of another path or a URL ($PGPILOT_CACHE/test/..., github.com/x/api/...).
	path := regexp.MustCompile(`(?:^|[^\w./$-])((?:` + strings.Join(tops, "|") + `)/[\w./-]*\w)`)
	for _, p := range pages(t) {
		text := read(t, p)
		for _, m := range path.FindAllStringSubmatchIndex(text, -1) {
			ref := text[m[2]:m[3]]
			if exists(ref) {
				continue
			}
			// A Go name qualified by its package's path: api/v1.Condition.
			dir, last := filepath.Split(ref)
			if name, _, ok := strings.Cut(last, "."); ok && exists(dir+name) {
				continue
			}
			t.Errorf("%s:%d: %s does not exist", p, lineOf(text, m[2]), ref)
		}
		// A path relative to the page (../x) must stay in the repository and exist.
		for _, m := range upward.FindAllStringSubmatchIndex(text, -1) {
			ref := text[m[2]:m[3]]
			rel := filepath.Join(filepath.Dir(p), ref)
			if strings.HasPrefix(rel, "..") || !exists(rel) {
				t.Errorf("%s:%d: %s is not a file of the repository", p, lineOf(text, m[2]), ref)
			}
		}
	}
}

var upward = regexp.MustCompile(`(?:^|[^\w./$-])((?:\.\./)+[\w./-]*\w)`)

func exists(rel string) bool {
	_, err := os.Stat(filepath.Join(root, rel))
	return err == nil
}

// Every test or benchmark the docs name is defined.
func TestNamedTestsExist(t *testing.T) {
	defined := map[string]bool{}
	funcName := regexp.MustCompile(`(?m)^func (?:\([^)]*\) )?((?:Test|Benchmark)\w+)\(`)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcName.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`\b(?:Test|Benchmark)[A-Z]\w*`)
	for _, p := range pages(t) {
		text := read(t, p)
		for _, m := range named.FindAllStringIndex(text, -1) {
			name := text[m[0]:m[1]]
			// "TestHungWALReceiver..." abbreviates a longer name.
			abbreviated := strings.HasPrefix(text[m[1]:], "...")
			if defined[name] || abbreviated && hasPrefix(defined, name) {
				continue
			}
			t.Errorf("%s:%d: %s is not defined in any _test.go file", p, lineOf(text, m[0]), name)
		}
	}
}

func hasPrefix(set map[string]bool, prefix string) bool {
	for k := range set {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// Every make target the docs show (`make demo`, or a line of a code block) is one of
// the Makefile's.
func TestMakeTargetsExist(t *testing.T) {
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([\w-]+):`).FindAllStringSubmatch(read(t, "Makefile"), -1) {
		targets[m[1]] = true
	}
	// make, then its words up to the first that is not a target (VAR=x, a flag, a
	// comment, a shell operator).
	command := regexp.MustCompile(`(?:^|[\s;&(])make((?: +[a-z][a-z0-9-]*)+)`)
	for _, p := range pages(t) {
		text := read(t, p)
		var spans []string
		for _, m := range codeSpan.FindAllString(text, -1) {
			spans = append(spans, strings.Trim(m, "`"))
		}
		for _, block := range fence.FindAllString(text, -1) {
			spans = append(spans, strings.Split(block, "\n")...)
		}
		for _, s := range spans {
			code, _, _ := strings.Cut(s, "#")
			for _, m := range command.FindAllStringSubmatch(code, -1) {
				for _, target := range strings.Fields(m[1]) {
					if !targets[target] {
						t.Errorf("%s: `make %s`: the Makefile has no target %s", p, strings.TrimSpace(m[1]), target)
					}
				}
			}
		}
	}
}

// The README links every page of docs/ ("Where to go next"), so none is orphaned.
func TestEveryDocIsLinkedFromTheREADME(t *testing.T) {
	readme := read(t, "README.md")
	for _, p := range pages(t) {
		if p == "README.md" {
			continue
		}
		if !strings.Contains(readme, "]("+filepath.ToSlash(p)+")") {
			t.Errorf("README.md does not link %s", p)
		}
	}
}
