package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The Dockerfile subset: the image's last stage, FROM scratch, is built as a builder
// would build it, with what its COPY --from lines take from earlier stages given as host
// directories (-from). This keeps one description of the image, the Dockerfile, for
// docker build and for a build without a daemon.

type instruction struct {
	line int
	cmd  string // upper case
	args string
}

// parseDockerfile splits a Dockerfile into its instructions, each FROM starting a stage;
// the instructions before the first FROM are stage -1's.
func parseDockerfile(data string) (stages [][]instruction, err error) {
	var cur []instruction
	started := false
	var line strings.Builder
	startLine := 0
	for i, raw := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(raw)
		if strings.HasPrefix(trimmed, "#") || (line.Len() == 0 && trimmed == "") {
			continue // comments and parser directives; empty lines between instructions
		}
		if line.Len() == 0 {
			startLine = i + 1
		}
		if cont, ok := strings.CutSuffix(trimmed, "\\"); ok {
			line.WriteString(cont + " ")
			continue
		}
		line.WriteString(trimmed)
		cmd, args, _ := strings.Cut(strings.TrimSpace(line.String()), " ")
		line.Reset()
		in := instruction{line: startLine, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if strings.Contains(in.args, "<<") && (in.cmd == "RUN" || in.cmd == "COPY") {
			return nil, fmt.Errorf("line %d: heredocs are not supported", in.line)
		}
		if in.cmd == "FROM" {
			if started {
				stages = append(stages, cur)
			}
			started = true
			cur = nil
		}
		cur = append(cur, in)
	}
	if line.Len() != 0 {
		return nil, fmt.Errorf("the Dockerfile ends inside a continued line")
	}
	if !started {
		return nil, fmt.Errorf("the Dockerfile has no FROM")
	}
	return append(stages, cur), nil
}

// words splits s as a shell would into words, with quotes and backslashes removed.
func words(s string) ([]string, error) {
	var out []string
	var w strings.Builder
	inWord := false
	var quote rune
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				w.WriteRune(c)
			}
		case quote == '"':
			if c == '"' {
				quote = 0
			} else if c == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`, rs[i+1]) {
				i++
				w.WriteRune(rs[i])
			} else {
				w.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == '\\' && i+1 < len(rs):
			i++
			w.WriteRune(rs[i])
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inWord {
		out = append(out, w.String())
	}
	return out, nil
}

// expand replaces $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alternative} outside
// single quotes; \$ is a literal dollar sign.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	var out strings.Builder
	inSingle, inDouble := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'' && !inDouble:
			inSingle = !inSingle
		case c == '"' && !inSingle && (i == 0 || s[i-1] != '\\'):
			inDouble = !inDouble
		}
		if inSingle {
			out.WriteByte(c) // no substitution between single quotes
			continue
		}
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			out.WriteString(`\$`) // kept escaped for words() to unescape
			i++
			continue
		}
		if c != '$' || i+1 == len(s) {
			out.WriteByte(c)
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${ in %q", s)
			}
			expr := s[i+2 : i+end]
			i += end
			name, word, op := expr, "", ""
			if j := strings.Index(expr, ":"); j >= 0 {
				name, op, word = expr[:j], expr[j:j+2], expr[j+2:]
				if op != ":-" && op != ":+" {
					return "", fmt.Errorf("unsupported substitution ${%s}", expr)
				}
			}
			v, ok := lookup(name)
			switch {
			case op == ":-" && (!ok || v == ""):
				v = word
			case op == ":+":
				if ok && v != "" {
					v = word
				} else {
					v = ""
				}
			}
			out.WriteString(v)
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || j > i+1 && s[j] >= '0' && s[j] <= '9') {
			j++
		}
		if j == i+1 {
			out.WriteByte(c)
			continue
		}
		v, _ := lookup(s[i+1 : j])
		out.WriteString(v)
		i = j - 1
	}
	return out.String(), nil
}

// dockerBuild is what the final stage needs from outside the Dockerfile.
type dockerBuild struct {
	contextDir string
	// from maps "stage:/path" of COPY --from=stage /path to a host path.
	from      map[string]string
	buildArgs map[string]string
}

// scratchStage builds the Dockerfile's last stage into l and cfg.
func (b *dockerBuild) scratchStage(dockerfile string, l *layer, cfg *v1.Config, plat v1.Platform) error {
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		return err
	}
	stages, err := parseDockerfile(string(data))
	if err != nil {
		return fmt.Errorf("%s: %w", dockerfile, err)
	}
	final := stages[len(stages)-1]
	from, err := words(final[0].args)
	if err != nil {
		return err
	}
	for len(from) > 0 && strings.HasPrefix(from[0], "--") {
		from = from[1:] // --platform: the image's platform is -platform's
	}
	if len(from) == 0 || !strings.EqualFold(from[0], "scratch") {
		return fmt.Errorf("%s:%d: the last stage must be FROM scratch (there is no registry to pull a base image from)", dockerfile, final[0].line)
	}
	ign, err := readDockerignore(b.contextDir)
	if err != nil {
		return err
	}
	l.ignore = ign

	// As BuildKit starts an image from scratch.
	cfg.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.WorkingDir = "/"
	args := map[string]string{
		"TARGETOS": plat.OS, "TARGETARCH": plat.Architecture, "TARGETVARIANT": plat.Variant,
		"TARGETPLATFORM": plat.OS + "/" + plat.Architecture,
	}
	lookup := func(name string) (string, bool) {
		for i := len(cfg.Env) - 1; i >= 0; i-- {
			if k, v, _ := strings.Cut(cfg.Env[i], "="); k == name {
				return v, true
			}
		}
		v, ok := args[name]
		return v, ok
	}
	for _, in := range final[1:] {
		at := fmt.Sprintf("%s:%d: %s", dockerfile, in.line, in.cmd)
		var ws []string
		if in.cmd != "ENTRYPOINT" && in.cmd != "CMD" {
			expanded, err := expand(in.args, lookup)
			if err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
			if ws, err = words(expanded); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		}
		switch in.cmd {
		case "ARG":
			for _, w := range ws {
				name, def, hasDef := strings.Cut(w, "=")
				if v, ok := b.buildArgs[name]; ok {
					args[name] = v
				} else if hasDef {
					args[name] = def
				} else if _, ok := args[name]; !ok {
					args[name] = ""
				}
			}
		case "LABEL", "ENV":
			if len(ws) == 2 && !strings.Contains(ws[0], "=") && in.cmd == "ENV" {
				ws = []string{ws[0] + "=" + ws[1]} // the old ENV NAME value form
			}
			for _, w := range ws {
				k, v, ok := strings.Cut(w, "=")
				if !ok || k == "" {
					return fmt.Errorf("%s: %q is not NAME=value", at, w)
				}
				if in.cmd == "ENV" {
					cfg.Env = setEnv(cfg.Env, k, v)
					continue
				}
				if cfg.Labels == nil {
					cfg.Labels = map[string]string{}
				}
				cfg.Labels[k] = v
			}
		case "WORKDIR":
			if len(ws) != 1 {
				return fmt.Errorf("%s: want one directory", at)
			}
			cfg.WorkingDir = path.Join(cfg.WorkingDir, ws[0])
			l.mkdir(cfg.WorkingDir)
		case "USER":
			if len(ws) != 1 {
				return fmt.Errorf("%s: want one user", at)
			}
			cfg.User = ws[0]
		case "ENTRYPOINT", "CMD":
			var argv []string
			if strings.HasPrefix(in.args, "[") {
				if err := json.Unmarshal([]byte(in.args), &argv); err != nil {
					return fmt.Errorf("%s: %w", at, err)
				}
			} else {
				argv = []string{"/bin/sh", "-c", in.args}
			}
			if in.cmd == "ENTRYPOINT" {
				cfg.Entrypoint, cfg.Cmd = argv, nil
			} else {
				cfg.Cmd = argv
			}
		case "EXPOSE":
			for _, p := range ws {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				if cfg.ExposedPorts == nil {
					cfg.ExposedPorts = map[string]struct{}{}
				}
				cfg.ExposedPorts[p] = struct{}{}
			}
		case "STOPSIGNAL":
			if len(ws) != 1 {
				return fmt.Errorf("%s: want one signal", at)
			}
			cfg.StopSignal = ws[0]
		case "COPY":
			if err := b.copy(l, ws, cfg.WorkingDir); err != nil {
				return fmt.Errorf("%s: %w", at, err)
			}
		default:
			return fmt.Errorf("%s is not supported in the last stage without a builder", at)
		}
	}
	return nil
}

// copy does what COPY [--from=stage] [--chown=uid:gid] [--chmod=mode] src... dst does.
func (b *dockerBuild) copy(l *layer, ws []string, workdir string) error {
	var own owner
	own.set = true // COPY makes files root's unless --chown says otherwise
	var mode *fs.FileMode
	stage := ""
	for len(ws) > 0 && strings.HasPrefix(ws[0], "--") {
		k, v, _ := strings.Cut(strings.TrimPrefix(ws[0], "--"), "=")
		ws = ws[1:]
		switch k {
		case "from":
			stage = v
		case "chown":
			o, err := parseOwner(v)
			if err != nil {
				return fmt.Errorf("--chown: %w (user names need the image's /etc/passwd)", err)
			}
			own = o
		case "chmod":
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o7777 {
				return fmt.Errorf("--chmod=%s: want an octal mode", v)
			}
			fm := fs.FileMode(m)
			mode = &fm
		case "link":
			// The same files either way.
		default:
			return fmt.Errorf("unsupported flag --%s", k)
		}
	}
	if len(ws) < 2 {
		return fmt.Errorf("want a source and a destination")
	}
	srcs, dst := ws[:len(ws)-1], ws[len(ws)-1]
	intoDir := strings.HasSuffix(dst, "/") || len(srcs) > 1
	dst = path.Join(workdir, dst)
	for _, src := range srcs {
		if strings.ContainsAny(src, "*?[") {
			return fmt.Errorf("%s: wildcards are not supported", src)
		}
		host, err := b.source(stage, src)
		if err != nil {
			return err
		}
		if stage == "" && l.ignore != nil && l.ignore(host) {
			// As a builder would: the file is not in the context it sends.
			return fmt.Errorf("%s: excluded from the build context by .dockerignore", src)
		}
		info, err := os.Stat(host)
		if err != nil {
			return err
		}
		if info.IsDir() {
			// A directory's contents go into dst; dst itself, when new, takes the
			// directory's mode and the copy's owner.
			if l.entries[imagePath(dst)] == nil {
				l.entries[imagePath(dst)] = &entry{name: imagePath(dst), src: host, info: info, own: own, mode: mode}
			}
			if err := l.addDir(host, dst, own, mode); err != nil {
				return err
			}
			continue
		}
		to := dst
		if intoDir {
			to = path.Join(dst, path.Base(src))
			l.mkdir(dst)
		}
		if err := l.addFile(host, to, own, mode); err != nil {
			return err
		}
	}
	return nil
}

// source is the host path of a COPY source: in the build context, or where -from says a
// stage's path is.
func (b *dockerBuild) source(stage, src string) (string, error) {
	if stage != "" {
		key := stage + ":" + path.Clean("/"+src)
		host, ok := b.from[key]
		if !ok {
			return "", fmt.Errorf("COPY --from=%s %s: no -from %s=DIR given", stage, src, key)
		}
		return host, nil
	}
	rel := path.Clean("/" + filepath.ToSlash(src))
	host := filepath.Join(b.contextDir, filepath.FromSlash(rel))
	if rel == "/" {
		return "", fmt.Errorf("copying the whole context is not supported")
	}
	return host, nil
}

// readDockerignore returns whether a host path under the context is left out of it, by
// the context's .dockerignore (plain patterns, no ! exceptions).
func readDockerignore(contextDir string) (func(string) bool, error) {
	data, err := os.ReadFile(filepath.Join(contextDir, ".dockerignore"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var patterns []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") || strings.Contains(line, "**") {
			return nil, fmt.Errorf(".dockerignore: %q: exceptions and ** are not supported", line)
		}
		patterns = append(patterns, strings.Trim(path.Clean("/"+line), "/"))
	}
	abs, err := filepath.Abs(contextDir)
	if err != nil {
		return nil, err
	}
	return func(p string) bool {
		ap, err := filepath.Abs(p)
		if err != nil {
			return false
		}
		rel, err := filepath.Rel(abs, ap)
		if err != nil || strings.HasPrefix(rel, "..") {
			return false // not in the context (a stage's files)
		}
		rel = filepath.ToSlash(rel)
		for _, pat := range patterns {
			// A pattern matches a path or any of its parents.
			for p := rel; p != "."; p = path.Dir(p) {
				if ok, _ := path.Match(pat, p); ok {
					return true
				}
			}
		}
		return false
	}, nil
}
