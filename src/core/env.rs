//! Environment variable names: which ones a skill may ask for.
//!
//! One list for every backend (the declaration reader, the SkillBinding
//! grants and the Job builder all call [`is_reserved`]). A reserved name is
//! one the runner sets itself, the server's own configuration, or a variable
//! that makes a program load code, or changes where it loads code from:
//! handing it to a script would let whoever controls the value run code in
//! the interpreter before the script's first line, or read the server's
//! settings. Each entry below names the documentation it comes from.

/// Exact names no skill may ask for.
pub const RESERVED_EXACT: &[&str] = &[
    // Set by the runner for every script (core::fence::FIXED_ENV).
    "PATH",
    "HOME",
    "LANG",
    "TZ",
    "TMPDIR",
    // The standalone server's configuration.
    "SKILLS_DIR",
    "RUST_LOG",
    // glibc: the loader's and libc's UNSECURE_ENVVARS (elf/dl-support and
    // sysdeps/generic/unsecvars.h): ignored for setuid programs because each
    // loads code or reads files chosen by the caller. LD_* is a prefix below.
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TZDIR",
    // Bash (bash(1), "INVOCATION" and "Shell Variables"): files sourced or
    // code run before the script; BASH_* is a prefix below.
    "ENV",
    "IFS",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "CDPATH",
    // Perl and Ruby, should a script start one (perlrun(1), ruby(1)).
    "PERL5LIB",
    "PERL5OPT",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    // JVM agents, should a script start one.
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    // git runs these as commands (git(1), "ENVIRONMENT VARIABLES").
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_EXEC_PATH",
    "GIT_ASKPASS",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "SSH_ASKPASS",
    // The egress proxy's address, set by the runner (a skill naming its
    // own proxy would route around the allowlist).
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

/// Prefixes no skill may ask for.
pub const RESERVED_PREFIXES: &[&str] = &[
    // The dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ... (ld.so(8)).
    "LD_",
    // macOS's loader, for completeness.
    "DYLD_",
    // Node: NODE_OPTIONS (--require), NODE_PATH, NODE_REPL_EXTERNAL_MODULE,
    // NODE_EXTRA_CA_CERTS, NODE_USE_ENV_PROXY (set by the runner) (node(1)).
    "NODE_",
    // Python: PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONUSERBASE,
    // PYTHONSAFEPATH, PYTHONINSPECT, ... (python(1), "ENVIRONMENT").
    "PYTHON",
    // Bash: BASH_ENV (sourced before the script), BASH_LOADABLES_PATH,
    // BASH_XTRACEFD, BASH_FUNC_* (exported functions).
    "BASH_",
    // OpenSSL: OPENSSL_CONF loads engines and providers (shared objects),
    // OPENSSL_ENGINES and OPENSSL_MODULES name where they load from (openssl-env(7)).
    "OPENSSL_",
    // npm and pip read their whole configuration (scripts, registries,
    // proxies) from these; the runner sets the proxy ones.
    "NPM_CONFIG_",
    "npm_config_",
    "PIP_",
    // git's configuration through the environment (GIT_CONFIG_COUNT/KEY/VALUE, GIT_CONFIG_GLOBAL).
    "GIT_CONFIG",
    // This project's own settings and the MCP host's.
    "MCP_",
    "SKILL_OPERATOR_",
    // Kubernetes injects these into every container.
    "KUBERNETES_",
];

/// Whether a variable name is reserved (see [`RESERVED_EXACT`], [`RESERVED_PREFIXES`]).
pub fn is_reserved(name: &str) -> bool {
    RESERVED_EXACT.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters.
pub fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variable the glibc, OpenSSL, Python, Node and Bash documentation
    /// names as loading code or choosing where code loads from.
    const CODE_LOADERS: &[&str] = &[
        // glibc
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "LD_DEBUG_OUTPUT",
        "LD_PROFILE",
        "LD_ORIGIN_PATH",
        "LD_BIND_NOW",
        "GLIBC_TUNABLES",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "MALLOC_TRACE",
        "HOSTALIASES",
        "RESOLV_HOST_CONF",
        // OpenSSL
        "OPENSSL_CONF",
        "OPENSSL_ENGINES",
        "OPENSSL_MODULES",
        "OPENSSL_CONF_INCLUDE",
        // Python
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
        // Node
        "NODE_OPTIONS",
        "NODE_PATH",
        "NODE_REPL_EXTERNAL_MODULE",
        "NODE_EXTRA_CA_CERTS",
        "NODE_USE_ENV_PROXY",
        // Bash
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "BASH_LOADABLES_PATH",
        "BASH_FUNC_x%%",
        // proxies the runner owns
        "HTTPS_PROXY",
        "https_proxy",
        "NO_PROXY",
        "PIP_PROXY",
        "npm_config_https_proxy",
    ];

    #[test]
    fn every_documented_code_loader_is_reserved() {
        let missing: Vec<&&str> = CODE_LOADERS.iter().filter(|n| !is_reserved(n)).collect();
        assert!(missing.is_empty(), "not reserved: {missing:?}");
    }

    #[test]
    fn ordinary_names_are_not() {
        for name in ["API_KEY", "WEATHER_API_KEY", "GITHUB_TOKEN", "DATABASE_URL", "LANGUAGE_MODEL", "PY_VERSION", "NODEJS"] {
            assert!(!is_reserved(name), "{name}");
        }
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("A_1") && is_identifier("_x"));
        assert!(!is_identifier("1X") && !is_identifier("A-B") && !is_identifier("") && !is_identifier(&"A".repeat(129)));
    }
}
