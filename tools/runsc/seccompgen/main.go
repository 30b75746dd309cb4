// seccompgen precompiles runsc's host seccomp filters, as gVisor's Bazel
// build does and a go build of the module does not (the module ships
// stubs that hold no program, so every runsc start and restore compiles
// its filters: 1.3-1.7 s here). It writes, for the Sentry's filters and
// the gofer's, a file that replaces the module's stub
// (filter_precompiled.go) in a go build -overlay of runsc.
//
// It is built with the overlay of sentry.go.in and gofer.go.in, which
// export what it needs of gVisor's config packages (scripts/runsc-bin.sh
// does both). It precompiles only the options paddock can run with (the
// systrap platform, no device proxies, no cgo), not gVisor's ~600; a runsc
// whose options match none compiles its filter as before. Each program
// is checked against the one runsc would compile from scratch.
//
// Usage: seccompgen -gvisor MODULE_DIR -out DIR
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentry "gvisor.dev/gvisor/runsc/boot/filter/config"
	gofer "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

func main() {
	module := flag.String("gvisor", "", "the gvisor.dev/gvisor module's directory")
	out := flag.String("out", "", "directory to write the generated files to")
	flag.Parse()
	if *module == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: seccompgen -gvisor MODULE_DIR -out DIR")
		os.Exit(2)
	}
	if err := run(*module, *out); err != nil {
		fmt.Fprintln(os.Stderr, "seccompgen:", err)
		os.Exit(1)
	}
}

func run(module, out string) error {
	sentryOpts, err := sentry.OptionsToPrecompile()
	if err != nil {
		return err
	}
	goferOpts, err := gofer.OptionsToPrecompile()
	if err != nil {
		return err
	}
	filters := []struct {
		dir      string // the filter package, in the module
		programs func() ([]precompiledseccomp.Program, error)
	}{
		{"runsc/boot/filter", func() ([]precompiledseccomp.Program, error) {
			return precompile(sentryOpts, func(o sentry.Options) bool {
				return o.Platform.ConfigKey() == "systrap" && !o.NVProxy && !o.TPUProxy && !o.RDMAProxy && !o.CgoEnabled
			}, sentry.Options.ConfigKey, sentry.Options.Vars, func(o sentry.Options, v precompiledseccomp.Values) *seccomp.Program {
				rules, deny := sentry.RulesWith(o, v)
				return program(rules, deny, sentry.SeccompOptions(o))
			})
		}},
		{"runsc/fsgofer/filter", func() ([]precompiledseccomp.Program, error) {
			return precompile(goferOpts, func(o gofer.Options) bool {
				return !o.CgoEnabled
			}, gofer.Options.ConfigKey, gofer.Options.Vars, func(o gofer.Options, v precompiledseccomp.Values) *seccomp.Program {
				rules, deny := gofer.RulesWith(o, v)
				return program(rules, deny, seccomp.ProgramOptions{})
			})
		}},
	}
	for _, f := range filters {
		programs, err := f.programs()
		if err != nil {
			return fmt.Errorf("%s: %w", f.dir, err)
		}
		stub, err := os.ReadFile(filepath.Join(module, f.dir, "filter_precompiled.go"))
		if err != nil {
			return err
		}
		src, err := fill(stub, programs)
		if err != nil {
			return fmt.Errorf("%s: %w", f.dir, err)
		}
		name := strings.ReplaceAll(f.dir, "/", "_") + "_precompiled.go"
		if err := os.WriteFile(filepath.Join(out, name), src, 0o644); err != nil {
			return err
		}
		fmt.Printf("seccompgen: %s: %d programs\n", f.dir, len(programs))
	}
	return nil
}

// program is the filter runsc installs (its Install builds the same).
func program(rules, deny seccomp.SyscallRules, opts seccomp.ProgramOptions) *seccomp.Program {
	return &seccomp.Program{
		RuleSets: []seccomp.RuleSet{
			{Rules: deny.Copy()},
			{Rules: rules.Copy(), Action: seccomp.Allow},
		},
		Options: opts,
	}
}

// precompile precompiles the program build makes for each of opts that
// keep accepts, in parallel, and checks that each, rendered with this
// process's variables, is the program runsc would compile from scratch.
func precompile[O any](opts []O, keep func(O) bool, key func(O) string, vars func(O) precompiledseccomp.Values,
	build func(O, precompiledseccomp.Values) *seccomp.Program) ([]precompiledseccomp.Program, error) {
	opts = slices.DeleteFunc(slices.Clone(opts), func(o O) bool { return !keep(o) })
	programs := make([]precompiledseccomp.Program, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		wg.Go(func() {
			values := vars(o)
			p, err := precompiledseccomp.Precompile(key(o), slices.Collect(maps.Keys(values)), func(v precompiledseccomp.Values) *seccomp.Program {
				return build(o, v)
			})
			if err == nil {
				err = same(p, values, build(o, values))
			}
			if err != nil {
				errs[i] = fmt.Errorf("options %s: %w", key(o), err)
			}
			programs[i] = p
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(programs, func(a, b precompiledseccomp.Program) int { return strings.Compare(a.Name, b.Name) })
	return programs, nil
}

// same checks that p rendered with values is scratch, compiled.
func same(p precompiledseccomp.Program, values precompiledseccomp.Values, scratch *seccomp.Program) error {
	p.Bytecode32 = slices.Clone(p.Bytecode32) // rendering writes into it
	rendered, err := p.RenderInstructions(values)
	if err != nil {
		return err
	}
	want, _, err := scratch.Build()
	if err != nil {
		return err
	}
	if !bytes.Equal(bpf.ToBytecode(rendered), bpf.ToBytecode(want)) {
		return fmt.Errorf("the precompiled program (%d instructions) differs from the one compiled from scratch (%d)", len(rendered), len(want))
	}
	return nil
}

// fill turns the module's stub into the file that holds programs: it
// registers them where the stub registers none, and says precompilation
// was not disabled.
func fill(stub []byte, programs []precompiledseccomp.Program) ([]byte, error) {
	const (
		disabled = "const PrecompilationDisabledAtBuildTime = true\n"
		register = "\tprecompiledPrograms = programs\n"
	)
	src := string(stub)
	if strings.Count(src, disabled) != 1 || strings.Count(src, register) != 1 {
		return nil, fmt.Errorf("the stub's form changed: no single %q and %q in it", disabled, register)
	}
	var regs strings.Builder
	for _, p := range programs {
		regs.WriteString(p.Registration("\t", "precompiledseccomp", "programs"))
	}
	src = strings.Replace(src, disabled, "const PrecompilationDisabledAtBuildTime = false\n", 1)
	src = strings.Replace(src, register, regs.String()+register, 1)
	return format.Source([]byte("// Code generated by paddock's tools/runsc/seccompgen. DO NOT EDIT.\n\n" + src))
}
