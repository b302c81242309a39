package pgconf

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Credential is a role's name and password, read from a mounted Secret.
type Credential struct {
	Username string
	Password string
}

// Credentials are the three roles the agent manages.
type Credentials struct {
	Superuser, Replication, App Credential
}

// LoadCredentials reads dir/{superuser,replication,app}/{username,password}.
func LoadCredentials(dir string) (Credentials, error) {
	read := func(name string) (Credential, error) {
		var c Credential
		for key, dst := range map[string]*string{"username": &c.Username, "password": &c.Password} {
			b, err := os.ReadFile(filepath.Join(dir, name, key))
			if err != nil {
				return c, fmt.Errorf("reading the %s credentials: %w (is the Secret mounted?)", name, err)
			}
			*dst = strings.TrimRight(string(b), "\r\n")
			if *dst == "" {
				return c, fmt.Errorf("the %s credentials have an empty %s", name, key)
			}
		}
		return c, nil
	}
	var cs Credentials
	var err error
	if cs.Superuser, err = read("superuser"); err != nil {
		return cs, err
	}
	if cs.Replication, err = read("replication"); err != nil {
		return cs, err
	}
	cs.App, err = read("app")
	return cs, err
}
