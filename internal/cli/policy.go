package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// policyFlags build a policy from the command line: --policy FILE as the
// base, then --allow/--deny rules (with --method for URL rules), presets
// and secret bindings added to it.
type policyFlags struct {
	file    string
	allow   []string
	deny    []string
	methods []string
	presets []string
	secrets []string
}

func (f *policyFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.file, "policy", "", "network policy file (JSON: allow, deny, presets, secrets)")
	fl.StringArrayVar(&f.allow, "allow", nil, "allow a destination: example.com, *.example.com, 10.0.0.0/8:5432, https://api.example.com/v1/; repeatable")
	fl.StringArrayVar(&f.deny, "deny", nil, "deny a destination (same forms; deny wins over allow); repeatable")
	fl.StringSliceVar(&f.methods, "method", nil, "limit the URL rules of --allow and --deny to these HTTP methods")
	fl.StringArrayVar(&f.presets, "preset", nil, "allow a preset: internet, pypi, npm, github, golang, debian; repeatable")
	fl.StringArrayVar(&f.secrets, "secret", nil, `inject a stored secret: NAME@HOST[,HOST...][/PATH-PREFIX][=INJECTION], INJECTION being "Header: format %s" (default "Authorization: Bearer %s"), basic:USER or query:PARAM; repeatable`)
}

func (f *policyFlags) set() bool {
	return f.file != "" || len(f.allow)+len(f.deny)+len(f.presets)+len(f.secrets) > 0
}

// policy returns the policy the flags describe, or nil when none is given.
func (f *policyFlags) policy(stdin io.Reader) (*api.Policy, error) {
	if !f.set() {
		return nil, nil
	}
	p := &api.Policy{}
	if f.file != "" {
		var b []byte
		var err error
		if f.file == "-" {
			b, err = io.ReadAll(io.LimitReader(stdin, 1<<20))
		} else {
			b, err = os.ReadFile(f.file)
		}
		if err != nil {
			return nil, fmt.Errorf("--policy: %w", err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(p); err != nil {
			return nil, fmt.Errorf("--policy %s: %w", f.file, err)
		}
	}
	rule := func(s string) api.PolicyRule {
		r := api.PolicyRule{Match: s}
		if strings.Contains(s, "://") {
			r.Methods = f.methods
		}
		return r
	}
	for _, a := range f.allow {
		p.Allow = append(p.Allow, rule(a))
	}
	for _, d := range f.deny {
		p.Deny = append(p.Deny, rule(d))
	}
	p.Presets = append(p.Presets, f.presets...)
	for _, s := range f.secrets {
		b, err := parseSecretBinding(s)
		if err != nil {
			return nil, err
		}
		p.Secrets = append(p.Secrets, b)
	}
	return p, nil
}

// parseSecretBinding reads NAME@HOST[,HOST...][/PATH][=INJECTION].
func parseSecretBinding(s string) (api.SecretBinding, error) {
	bad := func(why string) (api.SecretBinding, error) {
		return api.SecretBinding{}, fmt.Errorf("--secret %q: %s (want NAME@HOST[,HOST...][/PATH][=INJECTION])", s, why)
	}
	name, rest, ok := strings.Cut(s, "@")
	if !ok || name == "" {
		return bad("no NAME@")
	}
	scope, inj, hasInj := strings.Cut(rest, "=")
	if !hasInj {
		inj = "Authorization: Bearer %s"
	}
	hosts, path, hasPath := strings.Cut(scope, "/")
	if hosts == "" {
		return bad("no host")
	}
	b := api.SecretBinding{Name: name, Hosts: strings.Split(hosts, ",")}
	if hasPath {
		b.Paths = []string{"/" + path}
	}
	switch {
	case strings.HasPrefix(inj, "basic:"):
		b.Inject.Basic = &api.BasicAuth{User: strings.TrimPrefix(inj, "basic:")}
	case strings.HasPrefix(inj, "query:"):
		b.Inject.Query = strings.TrimPrefix(inj, "query:")
	default:
		h, format, ok := strings.Cut(inj, ":")
		if !ok {
			return bad(`the injection must be "Header: format %s", basic:USER or query:PARAM`)
		}
		b.Inject.Header, b.Inject.Format = strings.TrimSpace(h), strings.TrimSpace(format)
	}
	return b, nil
}

func policyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Read or replace a sandbox's network policy",
	}
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Print a sandbox's network policy as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			p, err := c.Policy(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return writeJSON(g.stdout, p)
		},
	}
	var pf policyFlags
	set := &cobra.Command{
		Use:   "set ID",
		Short: "Replace a sandbox's network policy (new connections follow it at once)",
		Long: "Replace a sandbox's network policy with the one the flags describe (--policy FILE, or - for\n" +
			"stdin, as the base; --allow, --deny, --preset and --secret added to it). With no flags the\n" +
			"policy becomes empty: the sandbox reaches nothing.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := pf.policy(cmd.InOrStdin())
			if err != nil {
				return err
			}
			if p == nil {
				p = &api.Policy{}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.SetPolicy(cmd.Context(), args[0], *p)
			if err != nil {
				return err
			}
			return writeJSON(g.stdout, out)
		},
	}
	pf.register(set)
	cmd.AddCommand(get, set)
	return cmd
}

func secretCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage secrets that sandboxes use without seeing them",
	}
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Store a secret, reading its value from stdin",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
			if err != nil {
				return err
			}
			value := strings.TrimRight(string(b), "\r\n")
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.CreateSecret(cmd.Context(), args[0], value); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, args[0])
			return nil
		},
	}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets (names only)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			for _, s := range list {
				fmt.Fprintln(g.stdout, s.Name)
			}
			return nil
		},
	}
	rm := removeCmd(g, "rm NAME...", "Remove secrets", (*client.Client).DeleteSecret)
	cmd.AddCommand(create, ls, rm)
	return cmd
}
