package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// versionString is `ckptfs --version`: the module version (a tag, or
// "(devel)" for a build from a checkout) and the VCS commit, time and dirty
// flag that `go build` records from the checkout (runtime/debug.ReadBuildInfo).
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "ckptfs (no build information)"
	}
	return formatVersion(bi)
}

func formatVersion(bi *debug.BuildInfo) string {
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	out := "ckptfs " + version
	if rev := settings["vcs.revision"]; rev != "" {
		out += " commit " + rev
		if settings["vcs.modified"] == "true" {
			out += "-dirty"
		}
		if t := settings["vcs.time"]; t != "" {
			out += " (" + t + ")"
		}
	} else {
		out += " commit unknown (built without VCS information)"
	}
	return fmt.Sprintf("%s %s %s/%s", out, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
