package testutil

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// Prometheus is a real Prometheus server a test runs (make prometheus builds it).
type Prometheus struct {
	base string
}

// StartPrometheus runs the Prometheus binary bin with scrape jobs, a 5 s scrape and
// evaluation interval, and rules (a rule file's content, nil for none), until the test
// ends; its log is shown when the test fails.
func StartPrometheus(t testing.TB, bin string, jobs []any, rules []byte) *Prometheus {
	t.Helper()
	dir := t.TempDir()
	config := map[string]any{
		"global":         map[string]any{"scrape_interval": "5s", "evaluation_interval": "5s"},
		"scrape_configs": jobs,
	}
	if rules != nil {
		path := filepath.Join(dir, "rules.yaml")
		if err := os.WriteFile(path, rules, 0o600); err != nil {
			t.Fatal(err)
		}
		config["rule_files"] = []string{path}
	}
	b, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			lines := strings.Split(string(b), "\n")
			t.Logf("Prometheus's log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	})
	p := &Prometheus{base: "http://" + addr}
	Eventually(t, time.Minute, func() error {
		_, err := p.Count("up")
		return err
	})
	return p
}

// Count is how many series query returns now; an error when Prometheus refuses it.
func (p *Prometheus) Count(query string) (int, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(query), &r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s: %s", query, r.Error)
	}
	return len(r.Data.Result), nil
}

// Alert returns nil when alert name with labels is in state ("firing", "pending"), or,
// for state "", when no such alert is active.
func (p *Prometheus) Alert(name string, labels map[string]string, state string) error {
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/alerts", &r); err != nil {
		return err
	}
	for _, a := range r.Data.Alerts {
		match := a.Labels["alertname"] == name
		for k, v := range labels {
			match = match && a.Labels[k] == v
		}
		if !match {
			continue
		}
		if state == "" {
			return fmt.Errorf("%s is %s", name, a.State)
		}
		if a.State == state {
			return nil
		}
		return fmt.Errorf("%s is %s, not %s", name, a.State, state)
	}
	if state == "" {
		return nil
	}
	return fmt.Errorf("%s is not %s", name, state)
}

func (p *Prometheus) get(path string, v any) error {
	resp, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
