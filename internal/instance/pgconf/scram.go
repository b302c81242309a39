package pgconf

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"strings"

	"golang.org/x/crypto/pbkdf2"
)

// scramIterations is PostgreSQL's default scram_iterations.
const scramIterations = 4096

// ScramVerifier returns the SCRAM-SHA-256 verifier PostgreSQL stores for password
// (RFC 7677, as pg_authid.rolpassword). Setting a role's password to a verifier keeps
// the password itself out of SQL text, logs and pg_stat_activity.
func ScramVerifier(password string, random io.Reader) (string, error) {
	salt := make([]byte, 16)
	if _, err := io.ReadFull(random, salt); err != nil {
		return "", fmt.Errorf("generating a salt: %w", err)
	}
	return scramVerifier(password, salt, scramIterations), nil
}

func scramVerifier(password string, salt []byte, iterations int) string {
	salted := pbkdf2.Key([]byte(password), salt, iterations, sha256.Size, sha256.New)
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey))
}

// ScramMatches reports whether verifier is a SCRAM-SHA-256 verifier of password.
func ScramMatches(verifier, password string) bool {
	rest, ok := strings.CutPrefix(verifier, "SCRAM-SHA-256$")
	if !ok {
		return false
	}
	params, _, ok := strings.Cut(rest, "$")
	if !ok {
		return false
	}
	iterText, saltText, ok := strings.Cut(params, ":")
	if !ok {
		return false
	}
	iterations, err := strconv.Atoi(iterText)
	if err != nil || iterations < 1 {
		return false
	}
	salt, err := base64.StdEncoding.DecodeString(saltText)
	if err != nil {
		return false
	}
	want := scramVerifier(password, salt, iterations)
	return subtle.ConstantTimeCompare([]byte(want), []byte(verifier)) == 1
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}
