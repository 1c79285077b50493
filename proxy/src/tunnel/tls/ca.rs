//! sluice's CA: created on first start (or loaded from configured files),
//! and the leaf certificates it mints per host, cached with a bound.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

/// Where the CA lives.
#[derive(Debug, Clone)]
pub struct CaPaths {
    /// The certificate (PEM), given to collectors.
    pub cert: PathBuf,
    /// The private key (PEM), mode 0600.
    pub key: PathBuf,
}

impl CaPaths {
    /// `<state_dir>/ca.crt` and `<state_dir>/ca.key`.
    pub fn in_state_dir(dir: &Path) -> Self {
        CaPaths {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        }
    }
}

/// The CA and its leaf cache.
pub struct CertAuthority {
    paths: CaPaths,
    issuer: Issuer<'static, KeyPair>,
    cache: Mutex<LeafCache>,
}

impl std::fmt::Debug for CertAuthority {
    // Never print key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("cert", &self.paths.cert)
            .finish_non_exhaustive()
    }
}

struct LeafCache {
    leaves: HashMap<String, Arc<CertifiedKey>>,
    order: VecDeque<String>,
    max: usize,
}

/// Why the CA could not be loaded or created, or a leaf not minted.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// One of the two files exists without the other.
    #[error("tls: found only one of {} and {}; restore the other or remove both", cert.display(), key.display())]
    Half {
        /// The certificate's path.
        cert: PathBuf,
        /// The key's path.
        key: PathBuf,
    },
    /// A file could not be read.
    #[error("tls: cannot read {}: {source}", path.display())]
    Read {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file or directory could not be created or written.
    #[error("tls: cannot write {}: {source}", path.display())]
    Write {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The key file holds no PEM private key.
    #[error("tls: {} is not a PEM private key", path.display())]
    NotAKey {
        /// Which.
        path: PathBuf,
    },
    /// The certificate file holds no usable CA certificate for the key.
    #[error("tls: {} is not a usable CA certificate: {source}", path.display())]
    NotACa {
        /// Which.
        path: PathBuf,
        /// Why.
        source: rcgen::Error,
    },
    /// Generating a key or a certificate failed.
    #[error("tls: {0}")]
    Mint(#[from] rcgen::Error),
    /// rustls refused the minted key.
    #[error("tls: {0}")]
    Key(#[from] rustls::Error),
}

/// How long minted leaves are valid; they are re-minted on restart.
const LEAF_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a created CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl CertAuthority {
    /// Loads the CA at `paths`, or creates it there if neither file
    /// exists. One file without the other is an error, not a new CA.
    pub fn load_or_create(paths: CaPaths, leaf_cache: usize) -> Result<Self, CaError> {
        let issuer = match (paths.cert.exists(), paths.key.exists()) {
            (true, true) => load(&paths)?,
            (false, false) => create(&paths)?,
            _ => {
                return Err(CaError::Half {
                    cert: paths.cert.clone(),
                    key: paths.key.clone(),
                })
            }
        };
        Ok(CertAuthority {
            paths,
            issuer,
            cache: Mutex::new(LeafCache {
                leaves: HashMap::new(),
                order: VecDeque::new(),
                max: leaf_cache.max(1),
            }),
        })
    }

    /// The CA certificate's path.
    pub fn cert_path(&self) -> &Path {
        &self.paths.cert
    }

    /// A leaf for `host` (a DNS name or an IP), minted once and cached.
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        if let Some(leaf) = self.lock().leaves.get(&host) {
            return Ok(leaf.clone());
        }
        let leaf = Arc::new(self.mint(&host)?);
        let mut cache = self.lock();
        if cache.leaves.len() >= cache.max {
            if let Some(oldest) = cache.order.pop_front() {
                cache.leaves.remove(&oldest);
            }
        }
        if cache.leaves.insert(host.clone(), leaf.clone()).is_none() {
            cache.order.push_back(host);
        }
        Ok(leaf)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeafCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_string()])?;
        params.distinguished_name.push(DnType::CommonName, host);
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::from_secs(3600);
        params.not_after = now + LEAF_VALIDITY;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&key_der)?;
        Ok(CertifiedKey::new(
            vec![CertificateDer::from(cert.der().to_vec())],
            signer,
        ))
    }
}

fn load(paths: &CaPaths) -> Result<Issuer<'static, KeyPair>, CaError> {
    let read = |path: &Path| {
        fs::read_to_string(path).map_err(|source| CaError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let key = KeyPair::from_pem(&read(&paths.key)?).map_err(|_| CaError::NotAKey {
        path: paths.key.clone(),
    })?;
    Issuer::from_ca_cert_pem(&read(&paths.cert)?, key).map_err(|source| CaError::NotACa {
        path: paths.cert.clone(),
        source,
    })
}

fn create(paths: &CaPaths) -> Result<Issuer<'static, KeyPair>, CaError> {
    if let Some(dir) = paths.cert.parent() {
        fs::create_dir_all(dir).map_err(|source| CaError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "sluice interception CA");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "sluice");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + CA_VALIDITY;
    let cert = params.self_signed(&key)?;
    // The key first, created 0600 so it is never readable by others.
    write_new(&paths.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&paths.cert, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %paths.cert.display(), "created sluice's interception CA");
    Ok(Issuer::new(params, key))
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(|source| CaError::Write {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_once_then_loads_and_mints_cached_leaves() {
        let dir = std::env::temp_dir().join(format!("sluice-ca-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let paths = CaPaths::in_state_dir(&dir);
        let ca = CertAuthority::load_or_create(paths.clone(), 2).unwrap();
        let mode = fs::metadata(&paths.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let a = ca.leaf("api.example.com").unwrap();
        assert!(
            Arc::ptr_eq(&a, &ca.leaf("API.example.com").unwrap()),
            "cached"
        );
        ca.leaf("127.0.0.1").unwrap();
        ca.leaf("[::1]").unwrap();
        assert!(ca.lock().leaves.len() <= 2, "bounded");
        let cert_before = fs::read(&paths.cert).unwrap();
        let again = CertAuthority::load_or_create(paths.clone(), 2).unwrap();
        again.leaf("api.example.com").unwrap();
        assert_eq!(
            fs::read(&paths.cert).unwrap(),
            cert_before,
            "loaded, not replaced"
        );
        fs::remove_file(&paths.key).unwrap();
        assert!(
            CertAuthority::load_or_create(paths, 2).is_err(),
            "one file alone is an error"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
