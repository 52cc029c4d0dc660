// Command ckptfs mounts a content-addressed checkpoint store as a filesystem and
// inspects stores.
//
// Exit status: 0 on success, 1 on any error, 2 on a usage error (a bad flag
// or argument, reported in one line with a pointer to --help).
//
// # Running as a service
//
//   - Who mounts: root calls mount(2) itself; anyone else goes through the
//     setuid fusermount3 (fusefs.Mount). What fusermount3 would refuse is
//     checked first (preflight.go), before the store is created, and a store
//     that a failed mount created is removed: a refused mount changes nothing.
//   - What a mount refuses, before it creates anything: a mountpoint that
//     is a store (STORE and MOUNTPOINT swapped), and one with files in it
//     unless --nonempty (the mount would hide them), beside what
//     fusermount3 and the store refuse.
//   - Privacy: the mount is the mounter's alone (no allow_other unless
//     --allow-other); a new store is 0700 with a 0600 catalog and objects, and
//     its root directory belongs to its creator. A store directory found
//     open to other users (made with mkdir) is made 0700 once the mount is
//     live, saying so in the log and to the user. The control socket
//     (control.go) is 0600 and checks each peer's uid (SO_PEERCRED): the
//     daemon's own user or root.
//   - mount(8): installed as /sbin/mount.fuse.ckptfs, the binary is mount's
//     helper (mounthelper.go): it starts `ckptfs mount` in a new session, in
//     /, and returns once the daemon reports the mount live on a pipe (which
//     also carries notes for the user's terminal); a daemon that fails first
//     has its error printed by the helper. `mount --background` is the same
//     from a shell, with STORE, MOUNTPOINT and --log taken relative to the
//     working directory.
//   - Output: numbers have one format everywhere, the HTML report included
//     (formatSig); help writes flags --name.
//   - Metrics: --metrics-addr serves Prometheus metrics (prometheus.go),
//     updated through fusefs.Observer and cas.Observer with atomic
//     instruments only.
//
// # Progress
//
// sync, import, gc and fsck report progress on stderr (progress.go): on a
// terminal one line redrawn at most 4 times a second, cleared at the end;
// elsewhere one summary line at the end (none with --json; sync's is its
// result on stdout). Given a mountpoint, the work runs in the daemon, which
// streams gc.Progress over the control socket (control.go); for sync it
// polls the store's upload counters, since the round sync waits for is often
// the uploader's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"os/signal"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// command is one subcommand.
type command struct {
	name    string
	usage   string // arguments, after the command name
	summary string
	run     func(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error
}

// commands lists the subcommands, for dispatch and the top-level help.
var commands = []command{
	{"mount", "[flags] STORE MOUNTPOINT", "mount STORE (created if missing) at MOUNTPOINT, in the foreground", runMount},
	{"stats", "[flags] PATH", "print the statistics of a mountpoint or an unmounted store", runStats},
	{"tensors", "[flags] FILE", "list a checkpoint's tensors: name, dtype, shape, file offset, bytes", runTensors},
	{"diff", "[flags] A B", "compare two checkpoints (files, or step directories of sharded ones) tensor by tensor, and what B adds to the store beyond A", runDiff},
	{"sync", "MOUNTPOINT", "wait until every file committed so far is uploaded to the mount's --remote; exit 1 saying why not", runSync},
	{"gc", "[flags] MOUNTPOINT|STORE", "delete chunks no file uses any more (inside the daemon when given a mountpoint)", runGC},
	{"fsck", "[flags] MOUNTPOINT|STORE", "check the store's catalog and objects; exits 1 naming each file and chunk at fault", runFsck},
	{"log", "[flags] RUN_DIR", "one row per step of a run: files, bytes, bytes added to the store, tensors changed, metrics", runLog},
	{"best", "--metric NAME [--mode min|max] RUN_DIR", "print the directory of the run's best step by a metric", runBest},
	{"du", "[flags] PATH...", "bytes of files in a mount: logical, unique, and what deleting them would free", runDu},
	{"import", "[flags] MOUNTPOINT|STORE SRC DEST", "copy a directory of checkpoints into a store at DEST (relative to the mount root); print the savings", runImport},
	{"report", "-o FILE.html RUN_DIR", "write a self-contained HTML page of a run: bytes per step, tensor changes, metric curves", runReport},
}

// errUsage marks a usage error (exit status 2); the flag set has printed help.
var errUsage = errors.New("usage error")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if isMountHelper(os.Args[0]) {
		os.Exit(runMountHelper(os.Args[1:], os.Stderr))
	}
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "version" || args[0] == "-version" {
		fmt.Fprintln(stdout, versionString())
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, c, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		}
		fmt.Fprintf(stderr, "ckptfs %s: %v\n", c.name, err)
		return 1
	}
	if near := suggestCommand(args[0]); near != "" {
		fmt.Fprintf(stderr, "ckptfs: unknown command %q: did you mean %s?\n", args[0], near)
	} else {
		fmt.Fprintf(stderr, "ckptfs: unknown command %q\n", args[0])
	}
	fmt.Fprintln(stderr, "Run 'ckptfs --help' for the list of commands.")
	return 2
}

// suggestCommand returns the command an unknown name was probably meant to
// be: the only one it is a prefix of, or the nearest within two edits; ""
// when none is close.
func suggestCommand(name string) string {
	var prefixOf []string
	best, bestDist := "", 3
	for _, c := range commands {
		if strings.HasPrefix(c.name, name) && name != "" {
			prefixOf = append(prefixOf, c.name)
		}
		if d := editDistance(name, c.name); d < bestDist {
			best, bestDist = c.name, d
		}
	}
	if len(prefixOf) == 1 {
		return prefixOf[0]
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "ckptfs: a deduplicating filesystem for ML checkpoints")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: ckptfs COMMAND [flags] ARGS  (ckptfs COMMAND --help for details; ckptfs --version)")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
}

// newFlags returns a flag set for command c whose help names its arguments.
func newFlags(c command, stderr io.Writer) *flag.FlagSet {
	fl := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() {
		fmt.Fprintf(stderr, "Usage: ckptfs %s %s\n\n%s.\n", c.name, c.usage, c.summary)
		var any bool
		fl.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintln(stderr, "\nFlags:")
			printFlags(stderr, fl)
		}
	}
	return fl
}

// flagName is how help and errors write a flag: --name, or -o for a
// one-letter name (the flag package accepts either form of both).
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// printFlags is flag.PrintDefaults with flags written as flagName does
// (--allow-other, as the README and the error messages write them).
func printFlags(w io.Writer, fl *flag.FlagSet) {
	fl.VisitAll(func(f *flag.Flag) {
		var b strings.Builder
		fmt.Fprintf(&b, "  %s", flagName(f.Name))
		typ, usage := flag.UnquoteUsage(f)
		if typ != "" {
			b.WriteString(" " + typ)
		}
		b.WriteString("\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		if !isZeroFlagValue(f) {
			if _, ok := f.Value.(interface{ IsBoolFlag() bool }); ok || typ != "string" {
				fmt.Fprintf(&b, " (default %v)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			}
		}
		fmt.Fprintln(w, b.String())
	})
}

// isZeroFlagValue reports whether f's default is its type's zero value (so
// help leaves it unsaid), as the flag package decides it.
func isZeroFlagValue(f *flag.Flag) bool {
	typ := reflect.TypeOf(f.Value)
	var z reflect.Value
	if typ.Kind() == reflect.Pointer {
		z = reflect.New(typ.Elem())
	} else {
		z = reflect.Zero(typ)
	}
	v, ok := z.Interface().(flag.Value)
	return ok && f.DefValue == v.String()
}

// parseArgs parses args (flags may come before or after the positional
// arguments) and checks that there are want positional arguments.
func parseArgs(fl *flag.FlagSet, args []string, want int) ([]string, error) {
	_, pos, err := parseFlagArgs(fl, args, want)
	return pos, err
}

// parseFlagArgs is parseArgs that also returns the arguments that were flags
// (splitFlagArgs).
func parseFlagArgs(fl *flag.FlagSet, args []string, want int) (flagArgs, pos []string, err error) {
	flagArgs, pos, err = splitFlagArgs(fl, args)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) != want {
		fmt.Fprintf(fl.Output(), "ckptfs %s: want %d argument(s), got %d\n\n", fl.Name(), want, len(pos))
		fl.Usage()
		return nil, nil, errUsage
	}
	return flagArgs, pos, nil
}

// parseArgsMin is parseArgs for commands that take min or more arguments.
func parseArgsMin(fl *flag.FlagSet, args []string, min int) ([]string, error) {
	pos, err := splitArgs(fl, args)
	if err != nil {
		return nil, err
	}
	if len(pos) < min {
		fmt.Fprintf(fl.Output(), "ckptfs %s: want at least %d argument(s), got %d\n\n", fl.Name(), min, len(pos))
		fl.Usage()
		return nil, errUsage
	}
	return pos, nil
}

// splitArgs parses the flags among args and returns the positional arguments.
// A bad flag is reported in one line in ckptfs's words (--name), not the
// flag package's, with a pointer to --help (exit status 2).
func splitArgs(fl *flag.FlagSet, args []string) ([]string, error) {
	_, pos, err := splitFlagArgs(fl, args)
	return pos, err
}

// splitFlagArgs is splitArgs that also returns the arguments that were
// flags and their values, in order ("--" dropped).
func splitFlagArgs(fl *flag.FlagSet, args []string) (flagArgs, pos []string, err error) {
	for {
		out, usage := fl.Output(), fl.Usage
		fl.SetOutput(io.Discard)
		fl.Usage = func() {}
		err := fl.Parse(args)
		fl.SetOutput(out)
		fl.Usage = usage
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fl.Usage()
				return nil, nil, err
			}
			fmt.Fprintf(out, "ckptfs %s: %s\nRun 'ckptfs %s --help' for usage.\n", fl.Name(), flagError(err), fl.Name())
			return nil, nil, errUsage
		}
		for _, a := range args[:len(args)-len(fl.Args())] {
			if a != "--" {
				flagArgs = append(flagArgs, a)
			}
		}
		args = fl.Args()
		if len(args) == 0 {
			return flagArgs, pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// flagError rewords the flag package's errors: flags are written --name.
func flagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return "unknown flag " + flagName(strings.TrimLeft(name, "-"))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return "flag " + flagName(strings.TrimLeft(name, "-")) + " needs a value"
	}
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		// invalid value "1x" for flag -grace: <reason>
		if v, after, ok := strings.Cut(rest, " for flag -"); ok {
			name, reason, _ := strings.Cut(after, ": ")
			return fmt.Sprintf("invalid value %s for %s: %s", v, flagName(name), reason)
		}
	}
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		if v, after, ok := strings.Cut(rest, " for -"); ok {
			name, _, _ := strings.Cut(after, ": ")
			return fmt.Sprintf("invalid value %s for %s: want true or false", v, flagName(name))
		}
	}
	return msg
}

// usageError prints "ckptfs NAME: msg" and a pointer to --help, and returns
// errUsage (exit status 2).
func usageError(c command, stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "ckptfs %s: %s\nRun 'ckptfs %s --help' for usage.\n", c.name, fmt.Sprintf(format, args...), c.name)
	return errUsage
}

// duration is a flag value like time.Duration's, plus days: 1d, 7d, 1d12h.
type duration time.Duration

func (d *duration) String() string { return time.Duration(*d).String() }

func (d *duration) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

// parseDuration is time.ParseDuration with a "d" (24 h) unit, and "0" alone.
func parseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	var days time.Duration
	if i := strings.Index(t, "d"); i >= 0 {
		n, err := strconv.ParseFloat(t[:i], 64)
		if err != nil || n < 0 || strings.HasPrefix(t[:i], "-") {
			return 0, fmt.Errorf("bad duration %q (want e.g. 1d, 12h, 30m, 0)", s)
		}
		days = time.Duration(n * float64(24*time.Hour))
		t = t[i+1:]
		if t == "" {
			return days, nil
		}
	}
	v, err := time.ParseDuration(t)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q (want e.g. 1d, 12h, 30m, 0)", s)
	}
	return days + v, nil
}

// byteSize is a flag value like 256MiB, 1G or 1048576.
type byteSize int64

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Set(s string) error {
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

func parseBytes(s string) (int64, error) {
	units := map[string]int64{
		"": 1, "b": 1,
		"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
		"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
		"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
		"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
	}
	t := strings.TrimSpace(strings.ToLower(s))
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult, ok := units[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("bad size %q (want e.g. 256MiB, 1GiB, 1048576)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad size %q (want e.g. 256MiB, 1GiB, 1048576)", s)
	}
	return int64(f * float64(mult)), nil
}

// formatBytes prints n in binary units with three significant digits
// (512 B, 1.80 MiB, 8.98 MiB, 12.3 GiB, 256 MiB): formatSig's format, the
// one every command's output and the HTML report (report.html's fmtBytes)
// use.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v, exp := float64(n), -1
	for (v >= unit || v <= -unit) && exp < len("KMGTPE")-1 {
		v /= unit
		exp++
	}
	return fmt.Sprintf("%s %ciB", formatSig(v, 3), "KMGTPE"[exp])
}

// formatSig is the number format of ckptfs's output: v to digits
// significant digits, trailing zeros kept so that a column's figures have
// the same precision (1.80 beside 1.97), integer digits never rounded away
// (1234), and exponent form only for magnitudes below 1e-4 or from 1e15
// (1.235e-05). NaN and infinities print as NaN, +Inf, -Inf. report.html's
// fmtSig is the same function in JavaScript; keep the two in step
// (TestReportFormatsNumbersAsTheCLI).
func formatSig(v float64, digits int) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case v == 0:
		return strconv.FormatFloat(0, 'f', digits-1, 64)
	}
	a := math.Abs(v)
	if a < 1e-4 || a >= 1e15 {
		return strconv.FormatFloat(v, 'e', digits-1, 64)
	}
	mag := int(math.Floor(math.Log10(a)))
	dec := max(0, digits-1-mag)
	s := fixedHalfUp(v, dec)
	// Rounding may carry into a new digit (9.996 -> 10.00): one decimal fewer.
	if r, _ := strconv.ParseFloat(s, 64); dec > 0 && math.Abs(r) >= math.Pow(10, float64(mag+1)) {
		s = fixedHalfUp(v, dec-1)
	}
	return s
}

// fixedHalfUp is strconv's 'f' format with dec decimals, an exact half
// rounded away from zero (1.125 -> 1.13), as JavaScript's toFixed does,
// where strconv rounds it to even (1.12).
func fixedHalfUp(v float64, dec int) string {
	exact := new(big.Float).SetFloat64(math.Abs(v)).Text('f', 1100)
	if i := strings.IndexByte(exact, '.'); i >= 0 && i+1+dec < len(exact) {
		rest := strings.TrimRight(exact[i+1+dec:], "0")
		if rest == "5" {
			v = math.Nextafter(v, math.Copysign(math.Inf(1), v))
		}
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// formatRatio is a ratio such as logical / unique: "2.00x".
func formatRatio(r float64) string { return formatSig(r, 3) + "x" }

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
