package main

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// mountCommand is `ckptfs mount`'s entry in commands.
func mountCommand(t *testing.T) command {
	t.Helper()
	for _, c := range commands {
		if c.name == "mount" {
			return c
		}
	}
	t.Fatal("no mount command")
	return command{}
}

// TestHelperArgsDeltaOptions: the helper passes the delta options, the
// remote ones, readahead and debug on as `ckptfs mount` flags, and
// `ckptfs mount` takes what it passes: -o delta_latest=delta,delta_keyframe=3
// is a mount with keyframe 3 and the latest version stored as a delta.
func TestHelperArgsDeltaOptions(t *testing.T) {
	for _, tc := range []struct {
		opts, want string
		check      func(*testing.T, *mountConfig)
	}{
		{"delta_latest=delta,delta_keyframe=3", "mount --delta-latest=delta --delta-keyframe=3 /s /m", func(t *testing.T, cfg *mountConfig) {
			if cfg.keyframe != 3 || cfg.latestWhole {
				t.Errorf("keyframe %d, latest whole %v; want 3, false", cfg.keyframe, cfg.latestWhole)
			}
		}},
		{"delta_latest=whole,readahead_kb=1024,debug,_netdev", "mount --delta-latest=whole --readahead-kb=1024 --debug /s /m", func(t *testing.T, cfg *mountConfig) {
			if !cfg.latestWhole || cfg.readAhead != 1024 || !cfg.debug {
				t.Errorf("latest whole %v, readahead %d, debug %v", cfg.latestWhole, cfg.readAhead, cfg.debug)
			}
		}},
		{"remote=s3://bucket/run,remote_timeout=30s,local_cache_size=2GiB,commit=remote",
			"mount --remote=s3://bucket/run --remote-timeout=30s --local-cache-size=2GiB --commit=remote /s /m", func(t *testing.T, cfg *mountConfig) {
				if cfg.remoteURL != "s3://bucket/run" || cfg.remoteTimeout != 30*time.Second || cfg.localCache != 2<<30 || cfg.commitMode != "remote" || cfg.readOnly {
					t.Errorf("remote %q timeout %v local cache %d commit %s read-only %v", cfg.remoteURL, cfg.remoteTimeout, cfg.localCache, cfg.commitMode, cfg.readOnly)
				}
			}},
		{"ro,remote=s3://bucket/run", "mount --read-only --remote=s3://bucket/run /s /m", func(t *testing.T, cfg *mountConfig) {
			if !cfg.readOnly || cfg.remoteURL != "s3://bucket/run" {
				t.Errorf("read-only %v remote %q", cfg.readOnly, cfg.remoteURL)
			}
		}},
	} {
		args, _, err := helperArgs([]string{"/s", "/m", "-o", tc.opts})
		if err != nil {
			t.Errorf("-o %s: %v", tc.opts, err)
			continue
		}
		if got := strings.Join(args, " "); got != tc.want {
			t.Errorf("-o %s: %q, want %q", tc.opts, got, tc.want)
			continue
		}
		var errOut bytes.Buffer
		cfg, err := parseMount(mountCommand(t), args[1:], &errOut)
		if err != nil {
			t.Errorf("-o %s: ckptfs %s: %v %s", tc.opts, strings.Join(args, " "), err, errOut.String())
			continue
		}
		tc.check(t, cfg)
	}
	for _, bad := range []string{"delta_latest", "delta_keyframe=", "remote", "debug=1", "ro", "ro,remote_timeout=3s"} {
		if _, _, err := helperArgs([]string{"/s", "/m", "-o", bad}); err == nil {
			t.Errorf("-o %s accepted", bad)
		}
	}
}

// TestHelperOptionsCoverMountFlags: every flag of `ckptfs mount` (its
// --help) is an -o option of the helper but --background (what the helper
// does), and every option is a flag of `ckptfs mount`: the helper cannot
// fall behind the command again.
func TestHelperOptionsCoverMountFlags(t *testing.T) {
	_, _, help := runCLI("mount", "--help")
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  (--[a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		flags = append(flags, m[1])
	}
	if len(flags) < 10 {
		t.Fatalf("mount --help lists %d flags: %q", len(flags), help)
	}
	for _, f := range flags {
		if f == "--background" {
			continue
		}
		if !slices.ContainsFunc(helperOptions, func(o mountOption) bool { return o.flag == f }) {
			t.Errorf("ckptfs mount %s has no -o option in the mount(8) helper (helperOptions)", f)
		}
	}
	for _, o := range helperOptions {
		if !slices.Contains(flags, o.flag) {
			t.Errorf("-o %s: ckptfs mount has no %s", o.name, o.flag)
		}
	}
}

// TestHelperUnknownOptionListsKnown: an unknown option's error lists the
// options the helper takes, all of them and only those.
func TestHelperUnknownOptionListsKnown(t *testing.T) {
	_, _, err := helperArgs([]string{"/s", "/m", "-o", "frobnicate=1"})
	if err == nil {
		t.Fatal("frobnicate accepted")
	}
	m := regexp.MustCompile(`\(ckptfs knows (.*)\)$`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("no list of options in %q", err)
	}
	listed := strings.Split(m[1], ", ")
	for _, k := range listed {
		_, _, errV := helperArgs([]string{"/s", "/m", "-o", k + "=1,remote=s3://b/p"})
		_, _, errB := helperArgs([]string{"/s", "/m", "-o", k + ",remote=s3://b/p"})
		if errV != nil && errB != nil {
			t.Errorf("%s is listed but refused: %v / %v", k, errV, errB)
		}
	}
	for _, k := range []string{"delta_latest", "delta_keyframe", "readahead_kb", "debug", "remote", "remote_timeout", "local_cache_size", "ro", "log"} {
		if !slices.Contains(listed, k) {
			t.Errorf("%s is not in the list %q", k, m[1])
		}
	}
}

// TestHelperWords: the daemon's errors read in the helper's options, a
// longer flag not taken for a shorter one it begins with.
func TestHelperWords(t *testing.T) {
	for in, want := range map[string]string{
		`invalid value "x" for --delta-keyframe: parse error`:     `invalid value "x" for delta_keyframe: parse error`,
		"--delta-latest must be whole or delta, not \"y\"":        "delta_latest must be whole or delta, not \"y\"",
		"--remote-timeout needs --remote and a positive duration": "remote_timeout needs remote and a positive duration",
		"--commit=remote needs --remote (and a writing mount)":    "commit=remote needs remote (and a writing mount)",
		"/m is not empty (a.txt): give --nonempty":                "/m is not empty (a.txt): give -o nonempty",
		"--allow-other needs a line":                              "-o allow_other needs a line",
		"--read-only needs --remote":                              "-o ro needs remote",
		"--local-cache-size must be more than 0":                  "local_cache_size must be more than 0",
		"--cache-size must be more than 0":                        "cache_size must be more than 0",
	} {
		if got := helperWords(in); got != want {
			t.Errorf("helperWords(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestHelperName: the helper's messages begin with the name it was run as,
// mount.ckptfs (mount -t ckptfs) as well as mount.fuse.ckptfs.
func TestHelperName(t *testing.T) {
	argv0 := os.Args[0]
	defer func() { os.Args[0] = argv0 }()
	for _, tc := range []struct{ argv0, name, typ string }{
		{"/sbin/mount.ckptfs", "mount.ckptfs", "ckptfs"},
		{"/sbin/mount.fuse.ckptfs", "mount.fuse.ckptfs", "fuse.ckptfs"},
	} {
		os.Args[0] = tc.argv0
		var errOut bytes.Buffer
		code := runMountHelper([]string{"/s", "/m", "-o", "frobnicate"}, &errOut)
		msg := errOut.String()
		if code != 1 || !strings.HasPrefix(msg, tc.name+": unknown option") || !strings.Contains(msg, "usage: mount -t "+tc.typ+" STORE") {
			t.Errorf("run as %s: exit %d, %q", tc.argv0, code, msg)
		}
	}
}
