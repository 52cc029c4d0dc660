package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// readme returns the repository's README.md.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the README's text from the heading title to the next
// heading of the same level.
func section(t *testing.T, text, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(text, "\n"+title+"\n")
	if !ok {
		t.Fatalf("README has no %q", title)
	}
	level := title[:strings.IndexByte(title, ' ')+1]
	if i := strings.Index(rest, "\n"+level); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// TestReadmeStatsSample: the quick start's sample of `stats` is in the
// format stats prints (formatBytes, formatRatio, formatSig), and says that
// compression settles once the background re-encoder is idle.
func TestReadmeStatsSample(t *testing.T) {
	qs := section(t, readme(t), "## Quick start")
	intro, rest, ok := strings.Cut(qs, "`stats` prints")
	if !ok || intro == "" {
		t.Fatal("README's quick start: no \"`stats` prints\" before the sample")
	}
	lead, block, ok := strings.Cut(rest, "```\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok || block == "" {
		t.Fatal("README's quick start: no sample block after \"`stats` prints\"")
	}
	if !strings.Contains(lead, "re-encoder") || !strings.Contains(lead, "idle") || !strings.Contains(lead, "reencode_pending") {
		t.Errorf("the sample's introduction should say that compression settles once the re-encoder is idle: %q", lead)
	}
	vals := map[string]float64{}
	line := regexp.MustCompile(`^(\S+)\s+(\d+)(?:\s+\((.*)\))?$`)
	checked := 0
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		m := line.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		vals[m[1]] = float64(n)
		if m[3] != "" {
			checked++
			if want := formatBytes(n); m[3] != want {
				t.Errorf("README sample: %s %d (%s), stats prints (%s)", m[1], n, m[3], want)
			}
		}
	}
	if checked < 5 {
		t.Errorf("README sample: %d byte figures found, want the 6 stats prints", checked)
	}
	for _, want := range []string{
		"dedup ratio             " + formatRatio(vals["logical_bytes"]/vals["unique_bytes"]) + "    (logical / unique)",
		"compression             " + formatSig(vals["stored_bytes"]/vals["unique_bytes"], 3) + "    (stored / unique)",
	} {
		if !strings.Contains(block, want) {
			t.Errorf("README sample lacks %q:\n%s", want, block)
		}
	}
}

// TestReadmeNamesEveryDependency: each module go.mod requires directly has
// a row in the README's dependency table (a row naming a module covers its
// sub-modules: aws-sdk-go-v2 covers aws-sdk-go-v2/config).
func TestReadmeNamesEveryDependency(t *testing.T) {
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var direct []string
	for _, l := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "require "))
		if len(f) == 2 && strings.Contains(f[0], ".") && strings.HasPrefix(f[1], "v") && !strings.Contains(l, "// indirect") {
			direct = append(direct, f[0])
		}
	}
	if len(direct) < 5 {
		t.Fatalf("go.mod: %d direct requirements found: %v", len(direct), direct)
	}
	var named []string
	for _, l := range strings.Split(section(t, readme(t), "## Dependencies"), "\n") {
		if cell, _, ok := strings.Cut(strings.TrimPrefix(l, "| "), " | "); ok && strings.HasPrefix(l, "| ") {
			for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cell, -1) {
				named = append(named, m[1])
			}
		}
	}
	for _, mod := range direct {
		ok := false
		for _, n := range named {
			ok = ok || mod == n || strings.HasPrefix(mod, n+"/")
		}
		if !ok {
			t.Errorf("README's dependency table does not name %s (go.mod requires it)", mod)
		}
	}
}

// TestReadmeQuickStartLetsCkptfsMakeTheStore: the quick start does not
// mkdir the store (that made it 0755 against "the store directory is
// created 0700"), and the install section says where SBINDIR is.
func TestReadmeQuickStartLetsCkptfsMakeTheStore(t *testing.T) {
	text := readme(t)
	for _, l := range strings.Split(section(t, text, "## Quick start"), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "mkdir") && strings.Contains(strings.SplitN(l, "#", 2)[0], "store") {
			t.Errorf("the quick start makes the store itself: %q", l)
		}
	}
	svc := section(t, text, "### As a system service")
	if !strings.Contains(svc, "SBINDIR") || strings.Contains(svc, "links\n`/sbin/mount.fuse.ckptfs`") {
		t.Errorf("the install section should say where SBINDIR is:\n%s", svc)
	}
}
